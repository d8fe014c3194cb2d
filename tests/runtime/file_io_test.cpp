// readWholeFile: the bytes of a file, or one error naming the file, its role and the reason.
#include <gtest/gtest.h>

#include <fstream>

#include "formats/Safetensors.h"
#include "support/FileIO.h"

namespace loom {
namespace {

std::string tmp(const std::string &name) {
  return std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

TEST(FileIO, ReadsEveryByte) {
  std::string path = tmp("bytes.bin"), written(200000, '\0');
  for (size_t i = 0; i < written.size(); ++i) written[i] = char(i * 7);
  std::ofstream(path, std::ios::binary) << written;
  std::string bytes = "stale";
  ASSERT_TRUE(readWholeFile(path, "the test file", &bytes).isOk());
  EXPECT_EQ(bytes, written);
  std::ofstream(tmp("empty.bin"));
  ASSERT_TRUE(readWholeFile(tmp("empty.bin"), "the test file", &bytes).isOk());
  EXPECT_TRUE(bytes.empty());
}

TEST(FileIO, ErrorsNameTheFileItsRoleAndTheReason) {
  std::string bytes;
  Status missing = readWholeFile(tmp("no_such_file"), "the test file", &bytes);
  EXPECT_EQ(missing.message(), tmp("no_such_file") + ": cannot read the test file: No such file or directory");
  // A directory opens but does not read: an error, not an empty file.
  Status dir = readWholeFile(tmp(""), "the test file", &bytes);
  EXPECT_EQ(dir.message(), tmp("") + ": cannot read the test file: Is a directory");
  SafetensorsFile f;
  EXPECT_NE(readSafetensors(tmp(""), &f).message().find("cannot read the safetensors file: Is a directory"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
