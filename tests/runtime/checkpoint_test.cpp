// Checkpoint manifests and the order --resume tries checkpoints in: a manifest that is not
// JSON, lacks a field or has one of the wrong type is a one-line error naming the file; a
// flipped byte is a checksum mismatch; the candidates are `latest`, then older ones.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "formats/Checkpoint.h"
#include "formats/Safetensors.h"
#include "support/Checksum.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string freshRoot(const std::string &name) {
  std::string root = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  fs::remove_all(root);
  fs::create_directories(root);
  return root;
}

void write(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A rank's file: one piece of tensor "param/w" ([2, 4], the rank's row), `payload` in its metadata.
void writeRankFile(const std::string &path, int rank, const std::string &payload) {
  SafetensorsFile f;
  HostTensor row{{4}};
  row.data = {float(rank), 1.0f, 2.0f, 3.0f};
  TensorPiece piece = shardPiece({2, 4}, 0, 2, rank);
  f.metadata["payload"] = payload;
  f.metadata["piece:param/w"] =
      pieceFact("param/w", {2, 4}, encodePiece(piece), checksumHex(checksum64(row.data.data(), 16)));
  f.tensors["param/w"] = std::move(row);
  ASSERT_TRUE(writeSafetensors(path, f).isOk());
}

// A published two-rank checkpoint at `iteration` whose files hold `payload`.
void publish(const std::string &root, int64_t iteration, const std::string &payload) {
  std::string partial = checkpointDir(root, iteration, true);
  fs::create_directories(partial);
  for (int r = 0; r < 2; ++r) writeRankFile(checkpointFile(partial, r), r, payload);
  ASSERT_TRUE(publishCheckpoint(root, iteration, 2, {{"iteration", std::to_string(iteration)}}).isOk());
}

// The file's bytes with one byte of `text` in it changed (same size).
void flipByteOf(const std::string &path, const std::string &text) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = bytes.find(text);
  ASSERT_NE(at, std::string::npos);
  bytes[at] ^= 1;
  write(path, bytes);
}

TEST(Checkpoint, ChecksumIsXxh3) {
  // XXH3-64 of the empty input and of "abc" (the library's published test values).
  EXPECT_EQ(checksumHex(checksum64("", 0)), "2d06800538d394c2");
  StreamingChecksum s;
  s.update("a", 1);
  s.update("bc", 2);
  EXPECT_EQ(s.digest(), checksum64(std::string("abc")));
}

TEST(Checkpoint, ManifestRoundTripsAndCatchesAFlippedByte) {
  std::string root = freshRoot("ckpt_roundtrip");
  publish(root, 5, "weights of iteration five");
  CheckpointManifest m;
  ASSERT_TRUE(readManifest(checkpointDir(root, 5), &m).isOk());
  EXPECT_EQ(m.iteration, 5);
  EXPECT_EQ(m.worldSize, 2);
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.files[1].name, "rank_00001.safetensors");
  EXPECT_TRUE(verifyCheckpointFile(root, 5, 0).isOk());
  EXPECT_TRUE(verifyCheckpointFile(root, 5, 1).isOk());
  std::string file = checkpointFile(checkpointDir(root, 5), 1);
  flipByteOf(file, "weights of iteration five");  // same size, one byte differs
  Status s = verifyCheckpointFile(root, 5, 1);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find(file + ": checksum mismatch"), std::string::npos) << s.message();
  EXPECT_TRUE(verifyCheckpointFile(root, 5, 0).isOk());
  Status missing = verifyCheckpointFile(root, 5, 7);
  EXPECT_NE(missing.message().find("no entry for rank 7"), std::string::npos) << missing.message();
}

TEST(Checkpoint, MetadataMapsEveryTensorToItsPiecesAndAReaderReassemblesThem) {
  std::string root = freshRoot("ckpt_index");
  publish(root, 3, "pieces");
  CheckpointIndex index;
  Status s = readVerifiedCheckpointIndex(root, 3, &index);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(index.worldSize, 2);
  EXPECT_EQ(index.state["iteration"], "3");
  ASSERT_EQ(index.tensors.count("param/w"), 1u);
  EXPECT_EQ(index.tensors["param/w"].shape, (std::vector<int64_t>{2, 4}));
  ASSERT_EQ(index.tensors["param/w"].pieces.size(), 2u);
  // The whole tensor from both ranks' rows; then a column block across them.
  CheckpointReader reader(checkpointDir(root, 3), index);
  std::vector<float> whole(8, -1.0f), column(2, -1.0f);
  ASSERT_TRUE(reader.read("param/w", shardPiece({2, 4}, -1, 1, 0), whole.data()).isOk());
  EXPECT_EQ(whole, (std::vector<float>{0, 1, 2, 3, 1, 1, 2, 3}));
  ASSERT_TRUE(reader.read("param/w", shardPiece({2, 4}, 1, 4, 0), column.data()).isOk());
  EXPECT_EQ(column, (std::vector<float>{0, 1}));
  EXPECT_FALSE(reader.read("param/none", shardPiece({2, 4}, -1, 1, 0), whole.data()).isOk());
  // A piece whose bytes changed after the fact is refused by its checksum, naming the file.
  std::string file = checkpointFile(checkpointDir(root, 3), 1);
  SafetensorsFile f;
  ASSERT_TRUE(readSafetensors(file, &f).isOk());
  f.tensors["param/w"].data[2] = 9.0f;
  ASSERT_TRUE(writeSafetensors(file, f).isOk());
  CheckpointReader again(checkpointDir(root, 3), index);
  s = again.read("param/w", shardPiece({2, 4}, -1, 1, 0), whole.data());
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find(file + ": checksum mismatch in piece 'param/w'"), std::string::npos) << s.message();
  // metadata.json changed after the fact: its size or checksum is not the manifest's.
  flipByteOf(checkpointDir(root, 3) + "/metadata.json", "param/w");
  s = readVerifiedCheckpointIndex(root, 3, &index);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("metadata.json: size or checksum differs"), std::string::npos) << s.message();
}

TEST(Checkpoint, MalformedMetadataNamesTheFieldInOneLine) {
  std::string root = freshRoot("ckpt_bad_index"), dir = checkpointDir(root, 1);
  fs::create_directories(dir);
  const std::string piece = "{\"file\": \"rank_00000.safetensors\", \"key\": \"k\", \"block\": \"0:4;0:4\", \"xxh3\": \"0\"}";
  auto index = [&](const std::string &tensors, const std::string &format = "loom-checkpoint-2") {
    return "{\"format\": \"" + format + "\", \"iteration\": 1, \"world_size\": 1, \"state\": {}, \"tensors\": " +
           tensors + "}";
  };
  const std::pair<std::string, const char *> bad[] = {
      {"not json", "corrupt (not a JSON object)"},
      {index("{}", "loom-checkpoint-1"), "corrupt format"},
      {index("{\"w\": {\"shape\": [4]}}"), "tensor 'w' (no pieces)"},
      {index("{\"w\": {\"shape\": [-4], \"pieces\": [" + piece + "]}}"), "tensor 'w' shape"},
      {index("{\"w\": {\"shape\": [3], \"pieces\": [" + piece + "]}}"), "piece block '0:4;0:4'"},
      {index("{\"w\": {\"shape\": [4], \"pieces\": [{\"file\": \"../../etc/passwd\", \"key\": \"k\", "
             "\"block\": \"0:4;0:4\", \"xxh3\": \"0\"}]}}"),
       "piece file '../../etc/passwd'"},
      {index("{\"w\": {\"shape\": [4], \"pieces\": [{\"file\": \"rank_00001.safetensors\", \"key\": \"k\", "
             "\"block\": \"0:4;0:4\", \"xxh3\": \"0\"}]}}"),
       "piece file 'rank_00001.safetensors'"},  // rank 1 of a 1-rank checkpoint
  };
  for (const auto &[text, want] : bad) {
    write(dir + "/metadata.json", text);
    CheckpointIndex got;
    Status s = readCheckpointIndex(dir, &got);
    ASSERT_FALSE(s.isOk()) << text;
    EXPECT_NE(s.message().find(dir + "/metadata.json: corrupt"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
  }
  write(dir + "/metadata.json", index("{\"w\": {\"shape\": [4], \"pieces\": [" + piece + "]}}"));
  CheckpointIndex good;
  EXPECT_TRUE(readCheckpointIndex(dir, &good).isOk());
}

TEST(Checkpoint, MalformedManifestsNameTheFile) {
  std::string root = freshRoot("ckpt_malformed"), dir = checkpointDir(root, 1);
  fs::create_directories(dir);
  std::string path = dir + "/manifest.json";
  const char *bad[] = {
      "{\"iteration\": 1, \"world_size\": 2, \"files\": [",                                     // cut short
      "[1, 2, 3]",                                                                             // not an object
      "{\"iteration\": \"one\", \"world_size\": 2, \"files\": []}",                              // wrong type
      "{\"iteration\": 1, \"world_size\": 2, \"files\": [{\"rank\": 9, \"file\": \"x\", "        // rank out of range
      "\"bytes\": 1, \"xxh3\": \"00\"}]}",
      "{\"iteration\": 1, \"world_size\": 2, \"files\": [{\"rank\": 0, \"bytes\": -4}]}",       // fields missing
      "\xff\xfe\x00garbage",                                                                    // not text
  };
  for (const char *text : bad) {
    write(path, text);
    CheckpointManifest m;
    Status s = readManifest(dir, &m);
    ASSERT_FALSE(s.isOk()) << text;
    EXPECT_EQ(s.message().rfind(path + ": corrupt", 0), 0u) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  }
}

TEST(Checkpoint, ResumeCandidatesAreLatestThenOlderOnes) {
  std::string root = freshRoot("ckpt_candidates");
  std::vector<int64_t> its;
  std::string note;
  resumeCandidates(root, &its, &note);
  EXPECT_TRUE(its.empty());
  EXPECT_TRUE(note.empty());
  publish(root, 2, "a");
  publish(root, 4, "b");
  publish(root, 6, "c");
  fs::create_directories(checkpointDir(root, 8, true));  // an interrupted save: never a candidate
  resumeCandidates(root, &its, &note);
  EXPECT_EQ(its, (std::vector<int64_t>{6, 4, 2}));
  EXPECT_TRUE(note.empty()) << note;
  write(root + "/latest_checkpointed_iteration.txt", "4\n");  // a newer one than `latest`: ignored
  resumeCandidates(root, &its, &note);
  EXPECT_EQ(its, (std::vector<int64_t>{4, 2}));
  write(root + "/latest_checkpointed_iteration.txt", "garbage");
  resumeCandidates(root, &its, &note);
  EXPECT_EQ(its, (std::vector<int64_t>{6, 4, 2}));
  EXPECT_NE(note.find("latest_checkpointed_iteration.txt: corrupt"), std::string::npos) << note;
  fs::remove(root + "/latest_checkpointed_iteration.txt");
  resumeCandidates(root, &its, &note);
  EXPECT_EQ(its, (std::vector<int64_t>{6, 4, 2}));
  EXPECT_NE(note.find("missing beside published checkpoints"), std::string::npos) << note;
}

}  // namespace
}  // namespace loom
