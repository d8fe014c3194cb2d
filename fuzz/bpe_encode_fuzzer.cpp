// GPT-2's tokenizer (the real encoder.json and vocab.bpe, from $LOOM_BPE_DIR) on arbitrary
// bytes, as loom-preprocess meets them in a corpus: byte-level BPE loses nothing, so decoding
// the ids must give back exactly the input, valid UTF-8 or not.
#include <cstdlib>

#include "data/Bpe.h"
#include "fuzz/FuzzSupport.h"

namespace {

loom::BpeTokenizer &tokenizer() {
  static std::unique_ptr<loom::BpeTokenizer> t = [] {
    const char *dir = std::getenv("LOOM_BPE_DIR");
    if (!dir) loom::fuzz::invariantBroken("set LOOM_BPE_DIR to the directory of GPT-2's encoder.json and vocab.bpe");
    std::unique_ptr<loom::BpeTokenizer> tok;
    loom::Status s = loom::BpeTokenizer::load(std::string(dir) + "/encoder.json", std::string(dir) + "/vocab.bpe", &tok);
    if (!s.isOk()) loom::fuzz::invariantBroken(s.message());
    return tok;
  }();
  return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  std::vector<int32_t> ids = tokenizer().encode(text);
  for (int32_t id : ids)
    if (id < 0 || id >= tokenizer().vocabSize()) loom::fuzz::invariantBroken("an id outside the vocabulary");
  if (tokenizer().decode(ids) != text) loom::fuzz::invariantBroken("decode(encode(text)) != text");
  return 0;
}
