// A checkpoint directory's small files: manifest.json (every rank's file, size and checksum),
// metadata.json (every tensor's pieces) and latest_checkpointed_iteration.txt (the first byte
// chooses), then what --resume does with them: the candidates it would try, each rank file's
// verification, the metadata read and a piece taken.
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
  std::string file = data[0] % 3 == 1   ? root + "/latest_checkpointed_iteration.txt"
                     : data[0] % 3 == 2 ? dir + "/metadata.json"
                                        : dir + "/manifest.json";
  loom::fuzz::writeScratch(file, data + 1, size - 1);
  loom::CheckpointManifest m;
  (void)loom::readManifest(dir, &m);
  // metadata.json: the tensors' pieces, then a reader taking one (the rank file has none).
  loom::CheckpointIndex index;
  if (loom::readCheckpointIndex(dir, &index).isOk())
    for (const auto &[name, tensor] : index.tensors) {
      std::vector<float> values(64);
      loom::TensorPiece want = loom::shardPiece(tensor.shape, -1, 1, 0);
      if (want.elements() <= 64) (void)loom::CheckpointReader(dir, index).read(name, want, values.data());
    }
  (void)loom::readVerifiedCheckpointIndex(root, 7, &index);
  int64_t latest;
  (void)loom::latestIteration(root, &latest);
  std::vector<int64_t> candidates;
  std::string note;
  loom::resumeCandidates(root, &candidates, &note);
  for (int rank : {0, 1, 1 << 20}) (void)loom::verifyCheckpointFile(root, 7, rank);
  std::filesystem::remove(file);
  return 0;
}
