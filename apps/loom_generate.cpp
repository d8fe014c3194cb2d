// loom-generate: sample text from a trained GPT (a safetensors file with Hugging Face GPT-2
// names, as `loom-rank --export` writes it). The model's forward pass is built from its config,
// lowered to a plan program and run by the CPU runtime, one full forward per new token.
//   loom-generate --model CONFIG.pbtxt --weights MODEL.safetensors --vocab encoder.json
//                 --merges vocab.bpe [--prompt TEXT] [--tokens 40] [--temperature 0.8]
//                 [--top-k 40] [--seed 1]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "config/ConfigLoader.h"
#include "compiler/Lowering.h"
#include "compiler/ModelBuilder.h"
#include "compiler/ToolSupport.h"
#include "runtime/Executor.h"
#include "formats/HfGpt2.h"
#include "formats/HfLlama.h"
#include "formats/Safetensors.h"
#include "support/CommandLine.h"
#include "data/Bpe.h"

constexpr char kUsage[] =
    "loom-generate: sample text from a trained model (a Hugging Face safetensors export).\n"
    "  loom-generate --model CONFIG.pbtxt --weights MODEL.safetensors --vocab encoder.json\n"
    "                --merges vocab.bpe [--prompt TEXT] [--tokens 40] [--temperature 0.8] [--top-k 40] [--seed 1]\n";

namespace cl = llvm::cl;

cl::OptionCategory category("loom-generate options");
cl::opt<std::string> modelFile("model", cl::desc("the model's config, required"), cl::value_desc("CONFIG.pbtxt"),
                           cl::cat(category));
cl::opt<std::string> weightsFile("weights", cl::desc("its trained weights (Hugging Face names), required"),
                             cl::value_desc("MODEL.safetensors"), cl::cat(category));
cl::opt<std::string> vocabFile("vocab", cl::desc("GPT-2's encoder.json, required"), cl::value_desc("encoder.json"),
                           cl::cat(category));
cl::opt<std::string> mergesFile("merges", cl::desc("GPT-2's vocab.bpe, required"), cl::value_desc("vocab.bpe"),
                            cl::cat(category));
cl::opt<std::string> prompt("prompt", cl::desc("the text to continue"), cl::value_desc("TEXT"), cl::init("The"),
                            cl::cat(category));
cl::opt<int64_t> tokensFlag("tokens", cl::desc("tokens to generate"), cl::value_desc("N"), cl::init(40),
                            cl::cat(category));
cl::opt<double> temperature("temperature", cl::desc("sampling temperature"), cl::value_desc("T"), cl::init(0.8),
                            cl::cat(category));
cl::opt<int> topK("top-k", cl::desc("sample among the K likeliest tokens"), cl::value_desc("K"), cl::init(40),
                  cl::cat(category));
cl::opt<uint64_t> seed("seed", cl::desc("sampling seed"), cl::value_desc("S"), cl::init(1), cl::cat(category));

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv, kUsage, {&category})) return 2;
  auto fail = [](const std::string &msg) {
    std::fprintf(stderr, "loom-generate: error: %s\n", msg.c_str());
    return 1;
  };
  for (const cl::opt<std::string> *f : {&modelFile, &weightsFile, &vocabFile, &mergesFile})
    if (!f->getNumOccurrences()) return fail("--" + f->ArgStr.str() + " is required");
  auto cfg = loom::loadModelConfig(modelFile);
  if (!cfg) return loom::reportError("loom-generate", cfg.takeError());
  if (cfg->architecture() == loom::config::BERT) return fail("a BERT encoder does not generate text");
  std::unique_ptr<loom::BpeTokenizer> bpe;
  if (loom::Status s = loom::BpeTokenizer::load(vocabFile, mergesFile, &bpe); !s.isOk())
    return fail(s.message());

  mlir::MLIRContext ctx;
  loom::OneLineDiagnostics diags(ctx);
  auto module = loom::buildModel(ctx, *cfg, {.microBatch = 1, .outputLogits = true});
  auto program = loom::lowerProgram(*module->getOps<mlir::func::FuncOp>().begin());
  if (!program) return loom::reportError("loom-generate", program.takeError());

  loom::SafetensorsFile file;
  if (loom::Status s = loom::readSafetensors(weightsFile, &file); !s.isOk()) return fail(s.message());
  // The built IR has the tokenizer's vocabulary (no padding pass runs for generation).
  int64_t padded = cfg->vocab_size(), seq = cfg->seq_length();
  std::map<std::string, loom::HostTensor> params;
  loom::Status read = cfg->architecture() == loom::config::LLAMA
                          ? loom::fromHuggingFaceLlama(file.tensors, padded, cfg->tie_word_embeddings(), &params)
                          : loom::fromHuggingFaceGpt2(file.tensors, padded, cfg->num_attention_heads(), &params);
  if (loom::Status s = read; !s.isOk())
    return fail(weightsFile + ": " + s.message());

  std::vector<int32_t> tokens = bpe->encode(prompt);
  if (tokens.empty()) tokens.push_back(bpe->endOfText());
  int64_t count = tokensFlag;
  std::mt19937_64 rng{uint64_t(seed)};
  loom::HostTensor input{{1, seq}};
  input.isInt = true;
  std::vector<const loom::HostTensor *> args;
  for (const loom::plan::Binding &a : program->arguments()) {
    if (a.role() == loom::plan::Binding::INPUT) {
      args.push_back(&input);
      continue;
    }
    auto it = params.find(a.name());
    if (it == params.end()) return fail(weightsFile + ": no tensor for '" + a.name() + "'");
    args.push_back(&it->second);
  }
  size_t promptLength = tokens.size();
  for (int64_t n = 0; n < count; ++n) {
    // The last `seq` tokens; positions after the context are padding the causal mask ignores.
    size_t first = tokens.size() > size_t(seq) ? tokens.size() - seq : 0, len = tokens.size() - first;
    input.ints.assign(seq, 0);
    std::copy(tokens.begin() + first, tokens.end(), input.ints.begin());
    std::vector<loom::HostTensor> out;
    if (loom::Status s = loom::executeProgram(*program, args, out, {}); !s.isOk()) return fail(s.message());
    const float *logits = out[0].data.data() + (len - 1) * padded;
    std::vector<std::pair<float, int32_t>> top;
    for (int32_t v = 0; v < int32_t(cfg->vocab_size()); ++v) top.push_back({logits[v], v});
    std::partial_sort(top.begin(), top.begin() + int(topK), top.end(), std::greater<>());
    top.resize(topK);
    std::vector<double> weights;
    for (auto &[l, v] : top) weights.push_back(std::exp((l - top[0].first) / std::max(double(temperature), 1e-6)));
    tokens.push_back(top[std::discrete_distribution<int>(weights.begin(), weights.end())(rng)].second);
  }
  std::printf("%s", bpe->decode(tokens).c_str());
  std::printf("\n");
  (void)promptLength;
  return 0;
}
