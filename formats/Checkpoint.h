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

#include "support/Status.h"

namespace loom {

std::string checkpointDir(const std::string &root, int64_t iteration, bool partial = false);
std::string checkpointFile(const std::string &dir, int rank);

// Rank 0, after every rank wrote its file into the partial directory: writes the manifest,
// publishes the directory and moves `latest`.
Status publishCheckpoint(const std::string &root, int64_t iteration, int worldSize);

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
};
Status readManifest(const std::string &dir, CheckpointManifest *manifest);

// Checks this rank's file against the manifest (exists, size, checksum).
Status verifyCheckpointFile(const std::string &root, int64_t iteration, int rank);

// The published iterations under `root` (those with a manifest), newest first.
std::vector<int64_t> publishedIterations(const std::string &root);

// What --resume tries, in order: the iteration `latest` names, then every older published
// one. `note` says why `latest` itself could not be used (corrupt or missing beside
// published checkpoints), empty otherwise.
void resumeCandidates(const std::string &root, std::vector<int64_t> *iterations, std::string *note);

uint64_t checksumOfFile(const std::string &path, int64_t *size);

}  // namespace loom
