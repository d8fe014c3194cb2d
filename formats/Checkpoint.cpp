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

std::string pieceFact(const std::string &tensor, const std::vector<int64_t> &globalShape, const std::string &piece,
                      const std::string &xxh3) {
  std::string shape;
  for (size_t k = 0; k < globalShape.size(); ++k) shape += (k ? "," : "") + std::to_string(globalShape[k]);
  return tensor + "|" + shape + "|" + piece + "|" + xxh3;
}

namespace {

// "a,b,c" -> {a, b, c}, non-negative decimal integers ("" -> {}).
bool parseShape(const std::string &text, std::vector<int64_t> *shape) {
  shape->clear();
  if (text.empty()) return true;
  size_t i = 0;
  while (true) {
    size_t comma = text.find(',', i);
    std::string d = text.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
    if (d.empty() || d.size() > 15 || d.find_first_not_of("0123456789") != std::string::npos) return false;
    shape->push_back(std::stoll(d));
    if (comma == std::string::npos) return true;
    i = comma + 1;
  }
}

// metadata.json from the rank files' piece facts.
Status buildIndex(const std::string &dir, int64_t iteration, int worldSize, const std::map<std::string, std::string> &state,
                  nlohmann::json *out) {
  nlohmann::json tensors = nlohmann::json::object();
  for (int r = 0; r < worldSize; ++r) {
    std::string f = checkpointFile(dir, r);
    SafetensorsIndex file;
    LOOM_RETURN_IF_ERROR(file.open(f));
    for (const auto &[key, fact] : file.metadata()) {
      if (key.rfind("piece:", 0) != 0) continue;
      std::string name = key.substr(6);
      size_t a = fact.find('|'), b = a == std::string::npos ? a : fact.find('|', a + 1),
             c = b == std::string::npos ? b : fact.find('|', b + 1);
      std::vector<int64_t> shape;
      TensorPiece piece;
      if (c == std::string::npos || !parseShape(fact.substr(a + 1, b - a - 1), &shape) ||
          !decodePiece(fact.substr(b + 1, c - b - 1), shape, &piece) || !file.has(name))
        return Status::error(f + ": corrupt piece fact '" + key + "'");
      std::string tensor = fact.substr(0, a);
      nlohmann::json &t = tensors[tensor];
      if (t.contains("shape") && t["shape"].get<std::vector<int64_t>>() != shape)
        return Status::error(f + ": tensor '" + tensor + "' has another global shape than in an earlier rank's file");
      t["shape"] = shape;
      t["pieces"].push_back({{"file", fs::path(f).filename().string()}, {"key", name},
                             {"block", encodePiece(piece)}, {"xxh3", fact.substr(c + 1)}});
    }
  }
  *out = {{"format", kCheckpointFormat}, {"iteration", iteration}, {"world_size", worldSize}, {"state", state},
          {"tensors", tensors}};
  return Status::ok();
}

}  // namespace

Status publishCheckpoint(const std::string &root, int64_t iteration, int worldSize,
                         const std::map<std::string, std::string> &state) {
  std::string partial = checkpointDir(root, iteration, true), final = checkpointDir(root, iteration);
  nlohmann::json files = nlohmann::json::array();
  for (int r = 0; r < worldSize; ++r) {
    std::string f = checkpointFile(partial, r);
    if (!fs::exists(f)) return Status::error(f + ": missing when publishing the checkpoint");
    int64_t size;
    uint64_t sum = checksumOfFile(f, &size);
    files.push_back({{"rank", r}, {"file", fs::path(f).filename().string()}, {"bytes", size}, {"xxh3", checksumHex(sum)}});
  }
  nlohmann::json index;
  LOOM_RETURN_IF_ERROR(buildIndex(partial, iteration, worldSize, state, &index));
  std::string indexPath = partial + "/metadata.json";
  LOOM_RETURN_IF_ERROR(writeFileAtomically(indexPath, index.dump(1) + "\n"));
  int64_t indexSize;
  uint64_t indexSum = checksumOfFile(indexPath, &indexSize);
  nlohmann::json manifest = {{"iteration", iteration},
                             {"world_size", worldSize},
                             {"files", files},
                             {"metadata", {{"file", "metadata.json"}, {"bytes", indexSize}, {"xxh3", checksumHex(indexSum)}}}};
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
  manifest->metadata = {};
  if (auto md = m.find("metadata"); md != m.end()) {
    if (!md->is_object() || !integer(*md, "bytes", &manifest->metadata.bytes) || manifest->metadata.bytes < 0 ||
        !md->contains("file") || !(*md)["file"].is_string() || (*md)["file"] != "metadata.json" ||
        !md->contains("xxh3") || !(*md)["xxh3"].is_string())
      return Status::error(path + ": corrupt metadata entry (expected file metadata.json, bytes and xxh3)");
    manifest->metadata.name = "metadata.json";
    manifest->metadata.xxh3 = (*md)["xxh3"].get<std::string>();
  }
  return Status::ok();
}

Status readCheckpointIndex(const std::string &dir, CheckpointIndex *index) {
  std::string path = dir + "/metadata.json";
  std::string text;
  LOOM_RETURN_IF_ERROR(readWholeFile(path, "the checkpoint's metadata", &text));
  nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) return Status::error(path + ": corrupt (not a JSON object)");
  auto corrupt = [&](const std::string &what) { return Status::error(path + ": corrupt " + what); };
  if (!m.contains("format") || m["format"] != kCheckpointFormat)
    return corrupt(std::string("format (expected \"") + kCheckpointFormat + "\")");
  if (!m.contains("iteration") || !m["iteration"].is_number_integer() || m["iteration"].get<int64_t>() < 0)
    return corrupt("iteration");
  if (!m.contains("world_size") || !m["world_size"].is_number_integer() || m["world_size"].get<int64_t>() < 1 ||
      m["world_size"].get<int64_t>() > (1 << 24))
    return corrupt("world_size");
  index->iteration = m["iteration"].get<int64_t>();
  index->worldSize = int(m["world_size"].get<int64_t>());
  index->state.clear(), index->tensors.clear();
  if (!m.contains("state") || !m["state"].is_object()) return corrupt("state");
  for (auto &[k, v] : m["state"].items()) {
    if (!v.is_string()) return corrupt("state '" + k + "' (not a string)");
    index->state[k] = v.get<std::string>();
  }
  if (!m.contains("tensors") || !m["tensors"].is_object()) return corrupt("tensors");
  for (auto &[name, t] : m["tensors"].items()) {
    CheckpointIndex::Tensor tensor;
    std::string where = "tensor '" + name + "'";
    if (!t.is_object() || !t.contains("shape") || !t["shape"].is_array() || t["shape"].size() > 8)
      return corrupt(where + " (no shape)");
    for (const nlohmann::json &d : t["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40)) return corrupt(where + " shape");
      tensor.shape.push_back(int64_t(d.get<uint64_t>()));
    }
    if (!t.contains("pieces") || !t["pieces"].is_array() || t["pieces"].empty()) return corrupt(where + " (no pieces)");
    for (const nlohmann::json &p : t["pieces"]) {
      CheckpointIndex::Piece piece;
      if (!p.is_object()) return corrupt(where + " piece");
      for (const char *field : {"file", "key", "block", "xxh3"})
        if (!p.contains(field) || !p[field].is_string()) return corrupt(where + " piece (no " + field + ")");
      piece.file = p["file"].get<std::string>(), piece.key = p["key"].get<std::string>();
      piece.xxh3 = p["xxh3"].get<std::string>();
      // A rank file of this directory, nothing else.
      int rank = -1;
      char rest[2];
      if (std::sscanf(piece.file.c_str(), "rank_%5d.safetensors%1s", &rank, rest) != 1 || rank < 0 ||
          rank >= index->worldSize || piece.file != fs::path(checkpointFile("", rank)).filename().string())
        return corrupt(where + " piece file '" + piece.file + "'");
      if (!decodePiece(p["block"].get<std::string>(), tensor.shape, &piece.piece))
        return corrupt(where + " piece block '" + p["block"].get<std::string>() + "'");
      tensor.pieces.push_back(std::move(piece));
    }
    index->tensors[name] = std::move(tensor);
  }
  return Status::ok();
}

Status CheckpointReader::read(const std::string &name, const TensorPiece &want, float *data) {
  auto t = index_.tensors.find(name);
  if (t == index_.tensors.end()) return Status::error(dir_ + ": no tensor '" + name + "' (a checkpoint of another model)");
  int64_t expected = copyOverlap(shardPiece(t->second.shape, -1, 1, 0), nullptr, want, nullptr), copied = 0;
  for (const CheckpointIndex::Piece &piece : t->second.pieces) {
    if (copyOverlap(piece.piece, nullptr, want, nullptr) == 0) continue;
    std::string id = piece.file + "/" + piece.key;
    auto cached = pieces_.find(id);
    if (cached == pieces_.end()) {
      SafetensorsIndex &file = files_[piece.file];
      std::string path = dir_ + "/" + piece.file;
      if (file.metadata().empty()) {
        // The file's size against the manifest's first: a truncated file is named as such.
        if (auto bytes = index_.fileBytes.find(piece.file); bytes != index_.fileBytes.end()) {
          std::error_code ec;
          int64_t size = int64_t(fs::file_size(path, ec));
          if (ec) return Status::error(path + ": missing (" + ec.message() + ")");
          if (size != bytes->second)
            return Status::error(path + ": " + std::to_string(size) + " bytes but the manifest says " +
                                 std::to_string(bytes->second) + " (truncated or corrupt checkpoint)");
        }
        LOOM_RETURN_IF_ERROR(file.open(path));
      }
      HostTensor values;
      LOOM_RETURN_IF_ERROR(file.read(piece.key, &values));
      if (values.isInt || int64_t(values.data.size()) != piece.piece.elements())
        return Status::error(path + ": piece '" + piece.key + "' has " + std::to_string(values.data.size()) +
                             " values, metadata.json says " + std::to_string(piece.piece.elements()));
      if (checksumHex(checksum64(values.data.data(), values.data.size() * sizeof(float))) != piece.xxh3)
        return Status::error(path + ": checksum mismatch in piece '" + piece.key + "' (a corrupt checkpoint)");
      cached = pieces_.emplace(id, std::move(values.data)).first;
    }
    copied += copyOverlap(piece.piece, cached->second.data(), want, data);
  }
  if (copied != expected)
    return Status::error(dir_ + ": the pieces of '" + name + "' hold " + std::to_string(copied) + " of the " +
                         std::to_string(expected) + " values wanted (an incomplete checkpoint)");
  return Status::ok();
}

namespace {
// The leading `size` entries of dimension `dim`.
HostTensor leading(const HostTensor &t, size_t dim, int64_t size) {
  int64_t outer = 1, inner = 1;
  for (size_t k = 0; k < dim; ++k) outer *= t.shape[k];
  for (size_t k = dim + 1; k < t.shape.size(); ++k) inner *= t.shape[k];
  HostTensor out{t.shape};
  out.shape[dim] = size;
  for (int64_t o = 0; o < outer; ++o) {
    const float *from = t.data.data() + o * t.shape[dim] * inner;
    out.data.insert(out.data.end(), from, from + size * inner);
  }
  return out;
}
}  // namespace

Status readWholeTensors(const std::string &root, int64_t iteration, const std::string &prefix,
                        std::map<std::string, HostTensor> *out) {
  CheckpointIndex index;
  LOOM_RETURN_IF_ERROR(readVerifiedCheckpointIndex(root, iteration, &index));
  std::string dir = resolvedCheckpointDir(root, iteration);
  std::map<std::string, std::pair<size_t, int64_t>> padding;  // name -> (dim, unpadded size)
  for (int r = 0; r < index.worldSize; ++r) {
    SafetensorsIndex file;
    LOOM_RETURN_IF_ERROR(file.open(checkpointFile(dir, r)));
    for (const auto &[key, value] : file.metadata()) {
      if (key.rfind("padding:", 0) != 0) continue;
      std::vector<int64_t> facts;
      if (!parseShape(value, &facts) || facts.size() != 2 || facts[1] <= 0)
        return Status::error(checkpointFile(dir, r) + ": corrupt padding facts of '" + key.substr(8) + "'");
      padding[key.substr(8)] = {size_t(facts[0]), facts[1]};
    }
  }
  CheckpointReader reader(dir, index);
  for (const auto &[tensor, facts] : index.tensors) {
    if (tensor.rfind(prefix, 0) != 0) continue;
    std::string name = tensor.substr(prefix.size());
    HostTensor full{facts.shape};
    full.data.assign(size_t(full.numel()), 0.0f);
    LOOM_RETURN_IF_ERROR(reader.read(tensor, shardPiece(facts.shape, -1, 1, 0), full.data.data()));
    if (auto pad = padding.find(name); pad != padding.end()) {
      if (pad->second.first >= full.shape.size() || pad->second.second > full.shape[pad->second.first])
        return Status::error(dir + ": the padding facts of '" + name + "' do not fit its shape");
      full = leading(full, pad->second.first, pad->second.second);
    }
    (*out)[name] = std::move(full);
  }
  return Status::ok();
}

Status readVerifiedCheckpointIndex(const std::string &root, int64_t iteration, CheckpointIndex *index) {
  std::string dir = resolvedCheckpointDir(root, iteration);
  CheckpointManifest m;
  LOOM_RETURN_IF_ERROR(readManifest(dir, &m));
  if (m.iteration != iteration)
    return Status::error(dir + "/manifest.json: describes iteration " + std::to_string(m.iteration));
  if (m.metadata.name.empty())
    return Status::error(dir + ": a checkpoint without metadata.json (written before the layout-independent format, "
                               "loom-checkpoint-2); it cannot be resumed by this version");
  std::string file = dir + "/metadata.json";
  if (!fs::exists(file)) return Status::error(file + ": missing");
  int64_t size;
  uint64_t got = checksumOfFile(file, &size);
  if (size != m.metadata.bytes || checksumHex(got) != m.metadata.xxh3)
    return Status::error(file + ": size or checksum differs from the manifest's (a corrupt checkpoint)");
  LOOM_RETURN_IF_ERROR(readCheckpointIndex(dir, index));
  for (const auto &[rank, f] : m.files) index->fileBytes[f.name] = f.bytes;
  if (index->iteration != iteration || index->worldSize != m.worldSize)
    return Status::error(file + ": describes iteration " + std::to_string(index->iteration) + " of " +
                         std::to_string(index->worldSize) + " ranks, the manifest " + std::to_string(iteration) + " of " +
                         std::to_string(m.worldSize));
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
