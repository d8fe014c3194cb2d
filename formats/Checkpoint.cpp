#include "formats/Checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/Checksum.h"
#include "support/FileIO.h"
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

uint64_t checksumOfFile(const std::string &path, int64_t *size) {
  std::ifstream in(path, std::ios::binary);
  StreamingChecksum sum;
  *size = 0;
  std::vector<char> buf(1 << 20);
  while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0) {
    sum.update(buf.data(), size_t(in.gcount()));
    *size += in.gcount();
  }
  return sum.digest();
}

Status publishCheckpoint(const std::string &root, int64_t iteration, int worldSize) {
  std::string partial = checkpointDir(root, iteration, true), final = checkpointDir(root, iteration);
  nlohmann::json files = nlohmann::json::array();
  for (int r = 0; r < worldSize; ++r) {
    std::string f = checkpointFile(partial, r);
    if (!fs::exists(f)) return Status::error(f + ": missing when publishing the checkpoint");
    int64_t size;
    uint64_t sum = checksumOfFile(f, &size);
    files.push_back({{"rank", r}, {"file", fs::path(f).filename().string()}, {"bytes", size}, {"xxh3", checksumHex(sum)}});
  }
  nlohmann::json manifest = {{"iteration", iteration}, {"world_size", worldSize}, {"files", files}};
  LOOM_RETURN_IF_ERROR(writeFileAtomically(partial + "/manifest.json", manifest.dump(1) + "\n"));
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

Status readManifest(const std::string &dir, CheckpointManifest *manifest) {
  std::string path = dir + "/manifest.json";
  if (!fs::exists(path)) return Status::error(path + ": missing (an incomplete checkpoint)");
  std::string text;
  LOOM_RETURN_IF_ERROR(readWholeFile(path, "the checkpoint manifest", &text));
  nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded()) return Status::error(path + ": corrupt (not JSON)");
  auto integer = [](const nlohmann::json &o, const char *key, int64_t *out) {
    auto it = o.find(key);
    if (it == o.end() || !it->is_number_integer()) return false;
    *out = it->get<int64_t>();
    return true;
  };
  int64_t worldSize = 0;
  if (!m.is_object() || !integer(m, "iteration", &manifest->iteration) || !integer(m, "world_size", &worldSize) ||
      worldSize <= 0 || !m.contains("files") || !m["files"].is_array())
    return Status::error(path + ": corrupt (expected iteration, world_size and files)");
  manifest->worldSize = int(worldSize);
  manifest->files.clear();
  for (const nlohmann::json &f : m["files"]) {
    CheckpointManifest::File file;
    int64_t rank = -1;
    if (!f.is_object() || !integer(f, "rank", &rank) || !integer(f, "bytes", &file.bytes) || rank < 0 ||
        rank >= worldSize || file.bytes < 0 || !f.contains("file") || !f["file"].is_string() ||
        !f.contains("xxh3") || !f["xxh3"].is_string())
      return Status::error(path + ": corrupt file entry " + std::to_string(manifest->files.size()) +
                           " (expected rank, file, bytes and xxh3)");
    file.name = f["file"].get<std::string>();
    file.xxh3 = f["xxh3"].get<std::string>();
    manifest->files[int(rank)] = file;
  }
  return Status::ok();
}

Status verifyCheckpointFile(const std::string &root, int64_t iteration, int rank) {
  std::string dir = resolvedCheckpointDir(root, iteration);
  CheckpointManifest m;
  LOOM_RETURN_IF_ERROR(readManifest(dir, &m));
  if (m.iteration != iteration)
    return Status::error(dir + "/manifest.json: describes iteration " + std::to_string(m.iteration));
  auto entry = m.files.find(rank);
  if (entry == m.files.end())
    return Status::error(dir + "/manifest.json: no entry for rank " + std::to_string(rank));
  std::string file = checkpointFile(dir, rank);
  if (!fs::exists(file)) return Status::error(file + ": missing");
  int64_t size;
  uint64_t got = checksumOfFile(file, &size);
  if (size != entry->second.bytes)
    return Status::error(file + ": " + std::to_string(size) + " bytes but the manifest says " +
                         std::to_string(entry->second.bytes) + " (truncated or corrupt checkpoint)");
  if (checksumHex(got) != entry->second.xxh3)
    return Status::error(file + ": checksum mismatch (xxh3 " + checksumHex(got) + ", the manifest says " +
                         entry->second.xxh3 + "): a corrupt checkpoint");
  return Status::ok();
}

std::vector<int64_t> publishedIterations(const std::string &root) {
  std::set<int64_t> found;
  std::error_code ec;
  for (const auto &entry : fs::directory_iterator(root, ec)) {
    std::string name = entry.path().filename().string();
    long long it = -1;
    char rest[16] = "";
    // iter_NNNNNNN, or its previous copy iter_NNNNNNN.replaced; never a .partial one.
    int n = std::sscanf(name.c_str(), "iter_%7lld%15s", &it, rest);
    if (n >= 1 && it >= 0 && name.size() >= 12 && (n == 1 || std::string(rest) == ".replaced") &&
        fs::exists(entry.path() / "manifest.json"))
      found.insert(it);
  }
  return {found.rbegin(), found.rend()};
}

void resumeCandidates(const std::string &root, std::vector<int64_t> *iterations, std::string *note) {
  iterations->clear();
  note->clear();
  int64_t latest = -1;
  Status s = latestIteration(root, &latest);
  std::vector<int64_t> published = publishedIterations(root);
  if (!s.isOk()) {
    latest = -1;
    *note = s.message();
  } else if (latest < 0 && !published.empty()) {
    *note = root + "/latest_checkpointed_iteration.txt: missing beside published checkpoints";
  }
  // `latest` first (if it is not complete on disk, its check says why), then every older
  // published checkpoint, newest first; without a readable `latest`, all of them.
  if (latest >= 0) iterations->push_back(latest);
  for (int64_t it : published)
    if (latest < 0 || it < latest) iterations->push_back(it);
}

}  // namespace loom
