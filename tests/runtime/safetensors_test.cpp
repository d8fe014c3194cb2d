// safetensors files round-trip, and corrupt ones (truncated, lying headers, absurd shapes,
// bad JSON, JSON of the wrong shape) are refused with a one-line message naming the file, never
// a crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

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
  // Headers that are not the safetensors shape: each a one-line error naming the file.
  std::string bad = "corrupt safetensors header";
  std::vector<Case> malformed = {
      {"not_json", "not json at all", 0, bad + ": not JSON"},
      {"empty_header", "", 0, bad + ": not JSON"},
      {"top_array", R"([{"dtype":"F32","shape":[1],"data_offsets":[0,4]}])", 4, bad + ": not a JSON object"},
      {"top_string", R"("w")", 0, bad + ": not a JSON object"},
      {"entry_number", R"({"w":5})", 0, "tensor 'w' is not an object"},
      {"entry_array", R"({"w":["F32",[1],[0,4]]})", 4, "tensor 'w' is not an object"},
      {"no_dtype", R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4, "tensor 'w' has no dtype"},
      {"no_shape", R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4, "tensor 'w' has no shape"},
      {"no_offsets", R"({"w":{"dtype":"F32","shape":[1]}})", 4, "tensor 'w' has no data_offsets"},
      {"dtype_number", R"({"w":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", 4, "has no dtype"},
      {"shape_string", R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4, "has no shape"},
      {"shape_fraction", R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, "has no shape"},
      {"shape_float", R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4, "has no shape"},
      {"shape_nested", R"({"w":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", 4, "has no shape"},
      {"offsets_one", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", 4, "has no data_offsets"},
      {"offsets_three", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 8, "has no data_offsets"},
      {"offsets_negative", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4, "has no data_offsets"},
      {"offsets_huge", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})", 4,
       "has no data_offsets"},
      {"offsets_null", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":null}})", 4, "has no data_offsets"},
      {"metadata_array", R"({"__metadata__":["pt"]})", 0, bad + ": __metadata__ is not an object"},
      {"metadata_number", R"({"__metadata__":{"format":1}})", 0, "__metadata__ 'format' is not a string"},
      {"metadata_nested", R"({"__metadata__":{"format":{"pt":"x"}}})", 0, "'format' is not a string"},
      {"name_newline", R"({"a\nb":{"dtype":"F32"}})", 0, "tensor 'a\\nb' has no shape"},
      {"dtype_newline", R"({"w":{"dtype":"F\n16","shape":[1],"data_offsets":[0,4]}})", 4, "has dtype F\\n16"},
      {"bad_utf8", "{\"w\xff\":{}}", 0, bad + ": not JSON"},
      // A number past any double: nlohmann's out_of_range (406), not a parse_error (found by
      // the fuzzer; it aborted the process).
      {"exponent_overflow", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[5E000000048161685201843,4]}})", 4,
       bad + ": [json.exception.out_of_range.406]"},
  };
  cases.insert(cases.end(), malformed.begin(), malformed.end());
  for (const Case &c : cases) {
    std::string path = craft(c.name + ".safetensors", c.header, c.data);
    SafetensorsFile f;
    Status s = readSafetensors(path, &f);
    EXPECT_FALSE(s.isOk()) << c.name;
    EXPECT_EQ(s.message().rfind(path + ": ", 0), 0u) << c.name << ": " << s.message();
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.name << ": " << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << c.name << ": " << s.message();
  }
  std::string shortFile = tmp("short.safetensors");
  std::ofstream(shortFile) << "abc";
  SafetensorsFile f;
  EXPECT_NE(readSafetensors(shortFile, &f).message().find("truncated (no header)"), std::string::npos);
  std::string lying = tmp("lying.safetensors");
  std::ofstream(lying, std::ios::binary) << std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10);
  EXPECT_NE(readSafetensors(lying, &f).message().find("header length"), std::string::npos);
}

// __metadata__ (string to string, per the safetensors spec) survives a write and read with
// characters JSON must escape; the header the writer produces is JSON of the spec's shape.
TEST(Safetensors, MetadataRoundTrips) {
  SafetensorsFile f;
  f.metadata = {{"format", "pt"}, {"quote\"back\\slash", "line\nbreak\ttab"}, {"unicode", "\xc3\xa9\xe2\x82\xac"}, {"", ""}};
  f.tensors["a.weight"] = HostTensor{{2}, {1.5f, -2}};
  f.tensors["scalar"] = HostTensor{{}, {3}};
  f.tensors["empty"] = HostTensor{{0, 4}};
  std::string path = tmp("metadata.safetensors");
  ASSERT_TRUE(writeSafetensors(path, f).isOk());
  SafetensorsFile g;
  Status s = readSafetensors(path, &g);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(g.metadata, f.metadata);
  ASSERT_EQ(g.tensors.size(), 3u);
  EXPECT_EQ(g.tensors["a.weight"].data, f.tensors["a.weight"].data);
  EXPECT_EQ(g.tensors["scalar"].shape, std::vector<int64_t>{});
  EXPECT_EQ(g.tensors["scalar"].data, std::vector<float>{3});
  EXPECT_EQ(g.tensors["empty"].shape, (std::vector<int64_t>{0, 4}));

  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t len;
  std::memcpy(&len, bytes.data(), 8);
  EXPECT_EQ(len % 8, 0u);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, len));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["a.weight"]["dtype"], "F32");
  EXPECT_EQ(header["a.weight"]["data_offsets"], nlohmann::json::array({0, 8}));
  EXPECT_EQ(bytes.size(), 8 + len + 12);  // 2 floats, a scalar and nothing for the empty tensor
}

// Names the header cannot hold are refused, not written as a broken file.
TEST(Safetensors, UnwritableNamesAreRefused) {
  SafetensorsFile f;
  f.tensors["__metadata__"] = HostTensor{{1}, {1}};
  EXPECT_NE(writeSafetensors(tmp("reserved.safetensors"), f).message().find("__metadata__"), std::string::npos);
  SafetensorsFile g;
  g.tensors["w\xff"] = HostTensor{{1}, {1}};
  Status s = writeSafetensors(tmp("not_utf8.safetensors"), g);
  EXPECT_NE(s.message().find("not valid UTF-8"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace loom
