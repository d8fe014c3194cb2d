// safetensors files round-trip, and corrupt ones (truncated, lying headers, absurd shapes,
// bad JSON) are refused with a message naming the file, never a crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>

#include "formats/Safetensors.h"

namespace loom {
namespace {

std::string tmp(const std::string &name) {
  return std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

// A file with the given JSON header and `data` bytes of payload.
std::string craft(const std::string &name, std::string header, size_t data) {
  while (header.size() % 8) header += ' ';
  uint64_t len = header.size();
  std::string bytes(reinterpret_cast<const char *>(&len), 8);
  bytes += header + std::string(data, '\0');
  std::string path = tmp(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(Safetensors, RoundTrip) {
  SafetensorsFile f;
  f.metadata["format"] = "pt";
  f.tensors["w"] = HostTensor{{2, 3}, {1, 2, 3, 4, 5, 6}};
  HostTensor ids{{4}};
  ids.isInt = true;
  ids.ints = {7, 8, 9, 10};
  f.tensors["ids"] = ids;
  std::string path = tmp("ok.safetensors");
  ASSERT_TRUE(writeSafetensors(path, f).isOk());
  SafetensorsFile g;
  Status s = readSafetensors(path, &g);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(g.metadata["format"], "pt");
  EXPECT_EQ(g.tensors["w"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(g.tensors["w"].data, f.tensors["w"].data);
  EXPECT_EQ(g.tensors["ids"].ints, ids.ints);
}

TEST(Safetensors, CorruptFilesAreRefused) {
  struct Case {
    std::string name, header;
    size_t data;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"truncated_data", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "larger than the file"},
      {"huge_shape", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
       "shape larger than the file"},
      {"negative_dim", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[4,0]}})", 8, "corrupt safetensors header"},
      {"offsets_reversed", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 8, "lies outside the file"},
      {"bad_json", R"({"w":{"dtype":"F32","shape":[1] "data_offsets":[0,4]}})", 4, "corrupt safetensors header"},
      {"unclosed", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", 4, "corrupt safetensors header"},
      {"other_dtype", R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4, "has dtype F16"},
      {"huge_number", R"({"w":{"dtype":"F32","shape":[99999999999999999999999],"data_offsets":[0,4]}})", 4,
       "corrupt safetensors header"},
  };
  for (const Case &c : cases) {
    std::string path = craft(c.name + ".safetensors", c.header, c.data);
    SafetensorsFile f;
    Status s = readSafetensors(path, &f);
    EXPECT_FALSE(s.isOk()) << c.name;
    EXPECT_NE(s.message().find(path), std::string::npos) << c.name << ": " << s.message();
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.name << ": " << s.message();
  }
  std::string shortFile = tmp("short.safetensors");
  std::ofstream(shortFile) << "abc";
  SafetensorsFile f;
  EXPECT_NE(readSafetensors(shortFile, &f).message().find("truncated (no header)"), std::string::npos);
  std::string lying = tmp("lying.safetensors");
  std::ofstream(lying, std::ios::binary) << std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10);
  EXPECT_NE(readSafetensors(lying, &f).message().find("header length"), std::string::npos);
}

}  // namespace
}  // namespace loom
