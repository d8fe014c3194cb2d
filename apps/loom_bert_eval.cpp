// loom-bert-eval: a trained BERT (a safetensors file in Hugging Face MegatronBertForPreTraining
// names, as `loom-rank --export` writes it) on held-out pairs and masks. Its forward pass (both
// heads' logits) is built from the config, lowered to a plan program and run by the CPU runtime.
//   loom-bert-eval --model CONFIG.pbtxt --weights MODEL.safetensors --data-prefix P
//                  [--samples 512] [--valid-fraction 0.05] [--seed 1234] [--batch 8]
//                  [--fill-mask "TEXT with [MASK]"]...
// On the validation split's samples (documents training never saw; Megatron's construction:
// sentence pairs, half swapped, 15% of the tokens masked) it prints the masked-LM loss and
// accuracy (top-1 at the masked positions), the sentence-order accuracy, and the unigram
// baseline's MLM accuracy (always the training split's most frequent masked token); then, for
// each --fill-mask text, the likeliest tokens at each [MASK].
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "compiler/Lowering.h"
#include "compiler/ModelBuilder.h"
#include "compiler/ToolSupport.h"
#include "config/ConfigLoader.h"
#include "data/BertDataset.h"
#include "data/WordPiece.h"
#include "formats/HfBert.h"
#include "formats/Safetensors.h"
#include "runtime/Executor.h"
#include "support/CommandLine.h"

constexpr char kUsage[] =
    "loom-bert-eval: a trained BERT (a Hugging Face MegatronBertForPreTraining export) on held-out pairs.\n"
    "  loom-bert-eval --model CONFIG.pbtxt --weights MODEL.safetensors --data-prefix P [--samples 512]\n"
    "                 [--valid-fraction 0.05] [--seed 1234] [--batch 8] [--fill-mask \"TEXT with [MASK]\"]...\n";

namespace cl = llvm::cl;

cl::OptionCategory category("loom-bert-eval options");
cl::opt<std::string> modelFile("model", cl::desc("the model's config, required"), cl::value_desc("CONFIG.pbtxt"),
                               cl::cat(category));
cl::opt<std::string> weightsFile("weights", cl::desc("its trained weights (Hugging Face names), required"),
                                 cl::value_desc("MODEL.safetensors"), cl::cat(category));
cl::opt<std::string> dataPrefix("data-prefix", cl::desc("the BERT dataset (loom-preprocess --tokenizer wordpiece), required"),
                                cl::value_desc("P"), cl::cat(category));
cl::opt<int64_t> samplesFlag("samples", cl::desc("validation samples to score"), cl::value_desc("N"), cl::init(512),
                             cl::cat(category));
cl::opt<double> validFraction("valid-fraction", cl::desc("the documents held out (as in training)"),
                              cl::value_desc("F"), cl::init(0.05), cl::cat(category));
cl::opt<uint64_t> seed("seed", cl::desc("the samples' seed (masking, pairs)"), cl::value_desc("S"), cl::init(1234),
                       cl::cat(category));
cl::opt<int64_t> batchFlag("batch", cl::desc("samples per forward pass"), cl::value_desc("B"), cl::init(8),
                           cl::cat(category));
cl::list<std::string> fillMask("fill-mask", cl::desc("a text with [MASK] tokens to fill (repeatable)"),
                               cl::value_desc("TEXT"), cl::cat(category));

namespace {

struct Scores {
  double mlmLoss = 0;
  int64_t masked = 0, mlmHits = 0, pairs = 0, sopHits = 0;
};

// Scores one batch from its two logits, [B, S, V] and [B, S, 2] (the vocabulary unpadded).
void score(const std::map<std::string, loom::HostTensor> &batch, const loom::HostTensor &mlm,
           const loom::HostTensor &sop, int64_t vocab, Scores *s) {
  const auto &labels = batch.at("labels").ints, &sopLabels = batch.at("sop_labels").ints;
  const auto &lossMask = batch.at("loss_mask").data;
  int64_t rows = batch.at("labels").shape[0], seq = batch.at("labels").shape[1];
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      int64_t at = b * seq + t;
      if (lossMask[size_t(at)] == 0) continue;
      const float *row = mlm.data.data() + at * vocab;
      int64_t best = std::max_element(row, row + vocab) - row;
      double mx = row[best], sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
      s->mlmLoss += mx + std::log(sum) - row[labels[size_t(at)]];
      s->mlmHits += best == labels[size_t(at)];
      ++s->masked;
    }
    const float *pair = sop.data.data() + b * seq * 2;  // the [CLS] position's two classes
    s->sopHits += int32_t(pair[1] > pair[0]) == sopLabels[size_t(b * seq)];
    ++s->pairs;
  }
}

}  // namespace

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv, kUsage, {&category})) return 2;
  auto fail = [](const std::string &msg) {
    std::fprintf(stderr, "loom-bert-eval: error: %s\n", msg.c_str());
    return 1;
  };
  for (const cl::opt<std::string> *f : {&modelFile, &weightsFile, &dataPrefix})
    if (!f->getNumOccurrences()) return fail("--" + f->ArgStr.str() + " is required");
  if (batchFlag < 1 || samplesFlag < 1) return fail("--batch and --samples must be >= 1");
  auto cfg = loom::loadModelConfig(modelFile);
  if (!cfg) return loom::reportError("loom-bert-eval", cfg.takeError());
  if (cfg->architecture() != loom::config::BERT) return fail(modelFile + ": not a BERT model (architecture: BERT)");
  loom::BertMetadata meta;
  if (loom::Status s = loom::readBertMetadata(dataPrefix, &meta); !s.isOk()) return fail(s.message());
  if (meta.vocab.size > cfg->vocab_size())
    return fail(dataPrefix + ": the dataset's vocabulary (" + std::to_string(meta.vocab.size) +
                ") is larger than the model's (" + std::to_string(cfg->vocab_size()) + ")");

  mlir::MLIRContext ctx;
  loom::OneLineDiagnostics diags(ctx);
  int64_t batch = batchFlag, seq = cfg->seq_length(), vocab = cfg->vocab_size();
  auto module = loom::buildModel(ctx, *cfg, {.microBatch = batch, .outputLogits = true});
  auto program = loom::lowerProgram(*module->getOps<mlir::func::FuncOp>().begin());
  if (!program) return loom::reportError("loom-bert-eval", program.takeError());

  loom::SafetensorsFile file;
  if (loom::Status s = loom::readSafetensors(weightsFile, &file); !s.isOk()) return fail(s.message());
  std::map<std::string, loom::HostTensor> params;  // the built IR has the unpadded vocabulary
  if (loom::Status s = loom::fromHuggingFaceBert(file.tensors, vocab, cfg->num_attention_heads(), &params); !s.isOk())
    return fail(weightsFile + ": " + s.message());

  // Runs the forward pass on a batch of inputs (by role); the two logits come back.
  auto forward = [&](std::map<std::string, loom::HostTensor> &inputs, std::vector<loom::HostTensor> *out) {
    std::vector<const loom::HostTensor *> args;
    for (const loom::plan::Binding &a : program->arguments()) {
      auto &source = a.role() == loom::plan::Binding::INPUT ? inputs : params;
      auto it = source.find(a.name());
      if (it == source.end()) return loom::Status::error(weightsFile + ": no tensor for '" + a.name() + "'");
      args.push_back(&it->second);
    }
    return loom::executeProgram(*program, args, *out, {});
  };

  loom::IndexedDataset corpus;
  if (loom::Status s = loom::IndexedDataset::open(dataPrefix, &corpus); !s.isOk()) return fail(s.message());
  std::shared_ptr<const loom::SentenceCorpus> sentences = loom::indexedSentences(corpus);
  loom::BertDataset valid(sentences, meta.vocab, meta.masking, loom::BertDataset::Split::kValidation, validFraction,
                          seq, seed);
  if (valid.samplesPerEpoch() == 0) return fail(dataPrefix + ": no validation samples (too few documents held out)");
  // Whole batches of the split's first samples (a last partial batch is left out: the count
  // scored is printed).
  int64_t samples = std::min<int64_t>(samplesFlag, valid.samplesPerEpoch());
  Scores s;
  for (int64_t first = 0; first + batch <= samples; first += batch) {
    std::map<std::string, loom::HostTensor> inputs = valid.batch(first, batch, seq);
    std::vector<loom::HostTensor> out;
    if (loom::Status st = forward(inputs, &out); !st.isOk()) return fail(st.message());
    score(inputs, out[0], out[1], vocab, &s);
  }
  if (s.masked == 0) return fail("no masked tokens scored (fewer validation samples than --batch?)");
  loom::BertBaseline base = loom::bertBaseline(corpus, meta, validFraction, seq, seed);
  std::unique_ptr<loom::WordPieceTokenizer> wp;
  if (loom::Status st = loom::WordPieceTokenizer::load(meta.vocabPath, &wp); !st.isOk()) return fail(st.message());
  std::printf("held-out: %lld sentence pairs, %lld masked tokens (validation documents: %.0f%% of the corpus)\n",
              (long long)s.pairs, (long long)s.masked, 100.0 * validFraction);
  std::printf("  MLM loss %.4f, MLM accuracy %.2f%% (unigram baseline: always \"%s\", %.2f%%)\n",
              s.mlmLoss / double(s.masked), 100.0 * double(s.mlmHits) / double(s.masked),
              base.token >= 0 && base.token < wp->vocabSize() ? wp->token(base.token).c_str() : "?", 100.0 * base.accuracy);
  std::printf("  SOP accuracy %.2f%% (chance: 50%%)\n", 100.0 * double(s.sopHits) / double(s.pairs));

  for (const std::string &text : fillMask) {
    // [CLS] pieces [SEP], the literal "[MASK]" kept as the mask token (BERT's never_split).
    std::vector<int32_t> ids{wp->clsId()};
    size_t at = 0;
    for (size_t next; (next = text.find("[MASK]", at)) != std::string::npos; at = next + 6) {
      for (int32_t id : wp->encode(text.substr(at, next - at))) ids.push_back(id);
      ids.push_back(wp->maskId());
    }
    for (int32_t id : wp->encode(text.substr(at))) ids.push_back(id);
    ids.push_back(wp->sepId());
    if (int64_t(ids.size()) > seq) return fail("--fill-mask: the text is longer than the model's sequence");
    std::map<std::string, loom::HostTensor> inputs;
    for (const char *role : {"tokens", "token_types"}) {
      loom::HostTensor t{{batch, seq}};
      t.isInt = true;
      t.ints.assign(size_t(batch * seq), 0);
      inputs[role] = t;
    }
    loom::HostTensor mask = loom::HostTensor::zeros({batch, seq});
    for (size_t i = 0; i < ids.size(); ++i) inputs["tokens"].ints[i] = ids[i], mask.data[i] = 1.0f;
    for (int64_t b = 1; b < batch; ++b) mask.data[size_t(b * seq)] = 1.0f;  // unused rows: [PAD] alone
    inputs["attention_mask"] = mask;
    std::vector<loom::HostTensor> out;
    if (loom::Status st = forward(inputs, &out); !st.isOk()) return fail(st.message());
    std::printf("fill-mask: %s\n", text.c_str());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] != wp->maskId()) continue;
      const float *row = out[0].data.data() + int64_t(i) * vocab;
      std::vector<int32_t> order(size_t(meta.vocab.size));
      for (size_t v = 0; v < order.size(); ++v) order[v] = int32_t(v);
      size_t top = std::min<size_t>(5, order.size());
      std::partial_sort(order.begin(), order.begin() + long(top), order.end(),
                        [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      std::printf("  [MASK] at %zu:", i);
      for (size_t k = 0; k < top; ++k) std::printf(" %s", wp->token(order[k]).c_str());
      std::printf("\n");
    }
  }
  return 0;
}
