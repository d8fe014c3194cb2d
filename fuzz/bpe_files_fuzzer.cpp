// A tokenizer's files (encoder.json and vocab.bpe: the input's two parts) through the loader,
// then a text with letters, digits, spaces and punctuation encoded and decoded with them.
#include "data/Bpe.h"
#include "fuzz/FuzzSupport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto [encoder, merges] = loom::fuzz::splitInput(data, size);
  std::string e = loom::fuzz::scratchPath("encoder.json"), m = loom::fuzz::scratchPath("vocab.bpe");
  loom::fuzz::writeScratch(e, encoder);
  loom::fuzz::writeScratch(m, merges);
  std::unique_ptr<loom::BpeTokenizer> t;
  if (!loom::BpeTokenizer::load(e, m, &t).isOk()) return 0;
  std::vector<int32_t> ids = t->encode("Hello, world! It's 2026:  tabs\tand\nlines \xc3\xa9t\xc3\xa9");
  (void)t->decode(ids);
  (void)t->decode({-1, 0, 1 << 30});
  return 0;
}
