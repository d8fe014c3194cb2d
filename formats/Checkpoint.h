// Sharded checkpoints (Megatron's layout): SAVE/iter_NNNNNNN/rank_R.safetensors per rank,
// a manifest.json with every file's size and checksum, and
// SAVE/latest_checkpointed_iteration.txt. Files are written atomically into
// iter_NNNNNNN.partial, which becomes iter_NNNNNNN only when every rank's file and the
// manifest are complete, and `latest` moves only after that: a crash never leaves a
// half-written checkpoint that looks complete, and an older checkpoint is never overwritten.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/Safetensors.h"
#include "formats/TensorPieces.h"
#include "support/Status.h"

namespace loom {

std::string checkpointDir(const std::string &root, int64_t iteration, bool partial = false);
std::string checkpointFile(const std::string &dir, int rank);

// Layout-independent checkpoints (format "loom-checkpoint-2"): each rank's file holds pieces of
// global tensors (formats/TensorPieces.h), each named in the file's metadata as
// "piece:KEY" = "TENSOR|SHAPE|PIECE|XXH3" (the tensor's global shape "d0,d1,...", the piece as
// encodePiece writes it, the XXH3-64 of its fp32 data); metadata.json maps every tensor to its
// pieces (file, key, block, checksum) and holds the training state once.
inline constexpr const char *kCheckpointFormat = "loom-checkpoint-2";
std::string pieceFact(const std::string &tensor, const std::vector<int64_t> &globalShape, const std::string &piece,
                      const std::string &xxh3);

struct CheckpointIndex {
  struct Piece {
    std::string file, key, xxh3;
    TensorPiece piece;
  };
  struct Tensor {
    std::vector<int64_t> shape;
    std::vector<Piece> pieces;
  };
  int64_t iteration = -1;
  int worldSize = 0;
  std::map<std::string, std::string> state;  // the training state (TrainingLoop's keys)
  std::map<std::string, Tensor> tensors;
  std::map<std::string, int64_t> fileBytes;  // the manifest's size of each rank file (readVerifiedCheckpointIndex)
};
// metadata.json of a checkpoint directory; every field checked (a one-line error naming it).
Status readCheckpointIndex(const std::string &dir, CheckpointIndex *index);

// Reads a checkpoint's pieces on demand, each (file, key) once and checked against its checksum:
// a rank of any layout takes the values it needs from whichever pieces hold them.
class CheckpointReader {
 public:
  CheckpointReader(std::string dir, const CheckpointIndex &index) : dir_(std::move(dir)), index_(index) {}
  // Tensor `name`'s values in `want` (its block in the checkpoint's coordinates) into `data`
  // (want.elements() values; those outside the checkpoint's shape, vocabulary padding, are left
  // as they are). An error when a value the checkpoint's shape holds is in none of its pieces.
  Status read(const std::string &name, const TensorPiece &want, float *data);

 private:
  std::string dir_;
  const CheckpointIndex &index_;
  std::map<std::string, SafetensorsIndex> files_;
  std::map<std::string, std::vector<float>> pieces_;  // "file/key" -> its checked values
};

// Every tensor of a verified checkpoint whose name starts with `prefix` ("param/", "adam_m/",
// "adam_v/"), whole, by the name after the prefix, without the vocabulary padding (the rank
// files' "padding:NAME" facts, "dim,size").
Status readWholeTensors(const std::string &root, int64_t iteration, const std::string &prefix,
                        std::map<std::string, HostTensor> *out);

// Rank 0, after every rank wrote its file into the partial directory: writes metadata.json
// (from the files' piece facts and `state`) and the manifest, publishes the directory and moves
// `latest`.
Status publishCheckpoint(const std::string &root, int64_t iteration, int worldSize,
                         const std::map<std::string, std::string> &state = {});

// The iteration named by `latest` (or -1 if there is no checkpoint).
Status latestIteration(const std::string &root, int64_t *iteration);

// The directory of a published iteration (its previous copy if a re-save was interrupted).
std::string resolvedCheckpointDir(const std::string &root, int64_t iteration);

// manifest.json: every rank's file with its size and XXH3-64 checksum.
struct CheckpointManifest {
  struct File {
    std::string name, xxh3;
    int64_t bytes = 0;
  };
  int64_t iteration = -1;
  int worldSize = 0;
  std::map<int, File> files;
  File metadata;  // metadata.json (empty name: a checkpoint without one)
};
Status readManifest(const std::string &dir, CheckpointManifest *manifest);

// Checks this rank's file against the manifest (exists, size, checksum).
Status verifyCheckpointFile(const std::string &root, int64_t iteration, int rank);
// Checks metadata.json against the manifest and reads it: what a rank of any layout reads first.
Status readVerifiedCheckpointIndex(const std::string &root, int64_t iteration, CheckpointIndex *index);

// The published iterations under `root` (those with a manifest), newest first.
std::vector<int64_t> publishedIterations(const std::string &root);

// What --resume tries, in order: the iteration `latest` names, then every older published
// one. `note` says why `latest` itself could not be used (corrupt or missing beside
// published checkpoints), empty otherwise.
void resumeCandidates(const std::string &root, std::vector<int64_t> *iterations, std::string *note);

uint64_t checksumOfFile(const std::string &path, int64_t *size);

}  // namespace loom
