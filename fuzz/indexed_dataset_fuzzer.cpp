// Megatron's indexed dataset (PREFIX.idx and PREFIX.bin: the input's two parts), opened as
// training opens it, then every token of every document read.
#include "data/IndexedDataset.h"
#include "fuzz/FuzzSupport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto [idx, bin] = loom::fuzz::splitInput(data, size);
  std::string prefix = loom::fuzz::scratchPath("dataset");
  loom::fuzz::writeScratch(prefix + ".idx", idx);
  loom::fuzz::writeScratch(prefix + ".bin", bin);
  loom::IndexedDataset ds;
  if (!loom::IndexedDataset::open(prefix, &ds).isOk()) return 0;
  int64_t sum = 0;
  for (int64_t d = 0; d < ds.documents(); ++d)
    for (int64_t i = 0; i < ds.documentLength(d); ++i) sum += ds.token(d, i);
  volatile int64_t keep = sum;
  (void)keep;
  return 0;
}
