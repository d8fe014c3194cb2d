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

// A published two-rank checkpoint at `iteration` whose files hold `payload`.
void publish(const std::string &root, int64_t iteration, const std::string &payload) {
  std::string partial = checkpointDir(root, iteration, true);
  fs::create_directories(partial);
  for (int r = 0; r < 2; ++r) write(checkpointFile(partial, r), payload + std::to_string(r));
  ASSERT_TRUE(publishCheckpoint(root, iteration, 2).isOk());
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
  write(file, "weights of iteration fivf1");  // same size, one byte differs
  Status s = verifyCheckpointFile(root, 5, 1);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find(file + ": checksum mismatch"), std::string::npos) << s.message();
  EXPECT_TRUE(verifyCheckpointFile(root, 5, 0).isOk());
  Status missing = verifyCheckpointFile(root, 5, 7);
  EXPECT_NE(missing.message().find("no entry for rank 7"), std::string::npos) << missing.message();
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
