#include "formats/Checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/Fnv1a.h"
#include "formats/Safetensors.h"

namespace loom {

namespace fs = std::filesystem;

std::string checkpointDir(const std::string &root, int64_t iteration, bool partial) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", (long long)iteration);
  return root + "/" + name + (partial ? ".partial" : "");
}

std::string checkpointFile(const std::string &dir, int rank) {
  char name[40];
  std::snprintf(name, sizeof name, "rank_%05d.safetensors", rank);
  return dir + "/" + name;
}

uint64_t fnv1aOfFile(const std::string &path, int64_t *size) {
  std::ifstream in(path, std::ios::binary);
  uint64_t h = kFnv1aOffset;
  *size = 0;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    h = fnv1a(buf, size_t(in.gcount()), h);
    *size += in.gcount();
  }
  return h;
}

Status publishCheckpoint(const std::string &root, int64_t iteration, int worldSize) {
  std::string partial = checkpointDir(root, iteration, true), final = checkpointDir(root, iteration);
  std::ostringstream manifest;
  manifest << "{\"iteration\": " << iteration << ", \"world_size\": " << worldSize << ", \"files\": [";
  for (int r = 0; r < worldSize; ++r) {
    std::string f = checkpointFile(partial, r);
    if (!fs::exists(f)) return Status::error(f + ": missing when publishing the checkpoint");
    int64_t size;
    uint64_t sum = fnv1aOfFile(f, &size);
    manifest << (r ? ", " : "") << "{\"rank\": " << r << ", \"file\": \"" << fs::path(f).filename().string()
             << "\", \"bytes\": " << size << ", \"fnv1a\": \"" << std::hex << sum << std::dec << "\"}";
  }
  manifest << "]}\n";
  LOOM_RETURN_IF_ERROR(writeFileAtomically(partial + "/manifest.json", manifest.str()));
  std::error_code ec;
  // The same iteration saved again: the old copy moves aside (never deleted before the new one
  // is in place; resume falls back to it if a crash lands between the two renames).
  std::string aside = final + ".replaced";
  fs::remove_all(aside, ec);
  if (fs::exists(final)) {
    fs::rename(final, aside, ec);
    if (ec) return Status::error(final + ": cannot move the previous copy aside: " + ec.message());
  }
  fs::rename(partial, final, ec);
  if (ec) return Status::error(final + ": cannot publish the checkpoint: " + ec.message());
  LOOM_RETURN_IF_ERROR(writeFileAtomically(root + "/latest_checkpointed_iteration.txt", std::to_string(iteration) + "\n"));
  fs::remove_all(aside, ec);
  return Status::ok();
}

Status latestIteration(const std::string &root, int64_t *iteration) {
  std::ifstream in(root + "/latest_checkpointed_iteration.txt");
  *iteration = -1;
  if (!in) return Status::ok();
  if (!(in >> *iteration) || *iteration < 0)
    return Status::error(root + "/latest_checkpointed_iteration.txt: corrupt (expected an iteration number)");
  return Status::ok();
}

std::string resolvedCheckpointDir(const std::string &root, int64_t iteration) {
  std::string dir = checkpointDir(root, iteration);
  if (!fs::exists(dir) && fs::exists(dir + ".replaced")) return dir + ".replaced";
  return dir;
}

Status verifyCheckpointFile(const std::string &root, int64_t iteration, int rank) {
  std::string dir = resolvedCheckpointDir(root, iteration);
  std::ifstream in(dir + "/manifest.json");
  if (!in) return Status::error(dir + "/manifest.json: missing (an incomplete checkpoint)");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string m = ss.str(), key = "{\"rank\": " + std::to_string(rank) + ",";
  size_t at = m.find(key);
  if (at == std::string::npos) return Status::error(dir + "/manifest.json: no entry for rank " + std::to_string(rank));
  long long bytes = 0;
  char sum[32] = "";
  size_t b = m.find("\"bytes\": ", at), f = m.find("\"fnv1a\": \"", at);
  if (b == std::string::npos || f == std::string::npos || std::sscanf(m.c_str() + b + 9, "%lld", &bytes) != 1 ||
      std::sscanf(m.c_str() + f + 10, "%16[0-9a-f]", sum) != 1)
    return Status::error(dir + "/manifest.json: corrupt");
  std::string file = checkpointFile(dir, rank);
  if (!fs::exists(file)) return Status::error(file + ": missing");
  int64_t size;
  uint64_t got = fnv1aOfFile(file, &size);
  if (size != bytes)
    return Status::error(file + ": " + std::to_string(size) + " bytes but the manifest says " + std::to_string(bytes) +
                         " (truncated or corrupt checkpoint)");
  char gotHex[32];
  std::snprintf(gotHex, sizeof gotHex, "%llx", (unsigned long long)got);
  if (std::string(gotHex) != sum) return Status::error(file + ": checksum mismatch (corrupt checkpoint)");
  return Status::ok();
}

}  // namespace loom
