// The compiler's text-format protobuf inputs: a model config, a cluster spec or a device file
// (the first byte chooses), through the loaders and their validation, as `loomc` reads them.
#include "config/ConfigLoader.h"
#include "fuzz/FuzzSupport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  std::string path = loom::fuzz::scratchPath("input.pbtxt");
  loom::fuzz::writeScratch(path, data + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto model = loom::loadModelConfig(path);
      if (!model) {
        llvm::consumeError(model.takeError());
        return 0;
      }
      for (int64_t t : {1, 2, 8}) (void)loom::paddedVocabSize(*model, t);
      return 0;
    }
    case 1: {
      auto cluster = loom::loadClusterSpec(path);
      if (!cluster) llvm::consumeError(cluster.takeError());
      return 0;
    }
    default: {
      auto device = loom::loadDeviceFile(path);
      if (!device) llvm::consumeError(device.takeError());
      return 0;
    }
  }
}
