// A checkpoint directory's small files: manifest.json (every rank's file, size and checksum)
// and latest_checkpointed_iteration.txt (the first byte chooses), then what --resume does with
// them: the candidates it would try and each rank file's verification.
#include <filesystem>

#include "formats/Checkpoint.h"
#include "fuzz/FuzzSupport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  static const std::string root = [] {
    std::string r = loom::fuzz::scratchPath("checkpoints");
    std::filesystem::create_directories(loom::checkpointDir(r, 7));
    loom::fuzz::writeScratch(loom::checkpointFile(loom::checkpointDir(r, 7), 0), std::string("rank zero's tensors"));
    return r;
  }();
  std::string dir = loom::checkpointDir(root, 7);
  std::string file = data[0] % 2 ? root + "/latest_checkpointed_iteration.txt" : dir + "/manifest.json";
  loom::fuzz::writeScratch(file, data + 1, size - 1);
  loom::CheckpointManifest m;
  (void)loom::readManifest(dir, &m);
  int64_t latest;
  (void)loom::latestIteration(root, &latest);
  std::vector<int64_t> candidates;
  std::string note;
  loom::resumeCandidates(root, &candidates, &note);
  for (int rank : {0, 1, 1 << 20}) (void)loom::verifyCheckpointFile(root, 7, rank);
  std::filesystem::remove(file);
  return 0;
}
