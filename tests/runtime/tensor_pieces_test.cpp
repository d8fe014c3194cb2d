// Pieces of global tensors (formats/TensorPieces.h): a tensor cut one way (tensor-parallel blocks,
// ZeRO-1 flat parts) is put back together cut another way, value for value.
#include "formats/TensorPieces.h"

#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

// The values of `piece` out of the global tensor of `shape` whose element i is i (row-major), by
// coordinates: every copied value says where it came from.
std::vector<float> valuesOf(const TensorPiece &piece, const std::vector<int64_t> &shape) {
  std::vector<float> out;
  std::vector<int64_t> extent(shape.size());
  for (size_t k = 0; k < shape.size(); ++k) extent[k] = piece.end[k] - piece.begin[k];
  for (int64_t f = piece.flatBegin; f < piece.flatEnd; ++f) {
    int64_t rest = f, global = 0, stride = 1;
    std::vector<int64_t> at(shape.size());
    for (size_t k = shape.size(); k-- > 0;) at[k] = rest % extent[k] + piece.begin[k], rest /= extent[k];
    for (size_t k = shape.size(); k-- > 0;) global += at[k] * stride, stride *= shape[k];
    out.push_back(float(global));
  }
  return out;
}

// ZeRO-1's cut: a block's elements in `parts` equal flat ranges.
std::vector<TensorPiece> flatParts(TensorPiece block, int parts) {
  std::vector<TensorPiece> out;
  int64_t n = block.blockElements() / parts;
  for (int q = 0; q < parts; ++q) {
    block.flatBegin = q * n, block.flatEnd = (q + 1) * n;
    out.push_back(block);
  }
  return out;
}

TEST(TensorPieces, ReshardsTensorParallelAndZeroPartsIntoAnotherLayout) {
  const std::vector<int64_t> shape = {6, 4, 10};
  // Saved: dim 1 over 2 ranks, each block in 3 ZeRO-1 parts.
  std::vector<std::pair<TensorPiece, std::vector<float>>> saved;
  for (int index = 0; index < 2; ++index)
    for (const TensorPiece &part : flatParts(shardPiece(shape, 1, 2, index), 3))
      saved.push_back({part, valuesOf(part, shape)});
  // Wanted: dim 0 over 3 ranks, and of rank 1's block the flat range [5, 37) (another ZeRO-1 part).
  for (int index = 0; index < 3; ++index) {
    TensorPiece want = shardPiece(shape, 0, 3, index);
    if (index == 1) want.flatBegin = 5, want.flatEnd = 37;
    std::vector<float> got(size_t(want.elements()), -1.0f);
    int64_t copied = 0;
    for (auto &[piece, values] : saved) copied += copyOverlap(piece, values.data(), want, got.data());
    EXPECT_EQ(copied, want.elements());
    EXPECT_EQ(got, valuesOf(want, shape)) << "block " << index;
    EXPECT_EQ(copyOverlap(shardPiece(shape, -1, 1, 0), nullptr, want, nullptr), want.elements());
  }
}

TEST(TensorPieces, PaddedRowsBeyondTheCheckpointStayUntouched) {
  // Saved with 10 rows, wanted with 12 (a layout padding the vocabulary further).
  TensorPiece saved = shardPiece({10, 4}, -1, 1, 0), want = shardPiece({12, 4}, 0, 2, 1);  // rows 6..11
  std::vector<float> values = valuesOf(saved, {10, 4}), got(size_t(want.elements()), 7.0f);
  EXPECT_EQ(copyOverlap(saved, values.data(), want, got.data()), 16);  // rows 6..9
  EXPECT_EQ(got[0], 24.0f);                                           // row 6, column 0
  EXPECT_EQ(got[16], 7.0f);                                           // row 10: not in the checkpoint
}

TEST(TensorPieces, DisjointBlocksShareNothing) {
  EXPECT_EQ(copyOverlap(shardPiece({8, 3}, 0, 2, 0), nullptr, shardPiece({8, 3}, 0, 2, 1), nullptr), 0);
  TensorPiece a = shardPiece({8}, -1, 1, 0), b = a;
  a.flatEnd = 4, b.flatBegin = 4;
  EXPECT_EQ(copyOverlap(a, nullptr, b, nullptr), 0);
}

TEST(TensorPieces, EncodesAndRefusesMalformedText) {
  TensorPiece p = shardPiece({6, 4, 10}, 1, 2, 1);
  p.flatBegin = 3, p.flatEnd = 50;
  TensorPiece back;
  ASSERT_TRUE(decodePiece(encodePiece(p), {6, 4, 10}, &back));
  EXPECT_EQ(back.begin, p.begin);
  EXPECT_EQ(back.end, p.end);
  EXPECT_EQ(back.flatBegin, 3);
  EXPECT_EQ(back.flatEnd, 50);
  for (const char *bad : {"", "0:6,2:4,0:10", "0:6,2:4,0:10;3", "0:6,2:4;0:1", "0:7,2:4,0:10;0:1", "0:6,4:2,0:10;0:1",
                          "0:6,2:4,0:10;50:3", "0:6,2:4,0:10;0:121", "0:6,2:4,-1:10;0:1", "a:6,2:4,0:10;0:1",
                          "0:6,2:4,0:10;0:99999999999999999999"})
    EXPECT_FALSE(decodePiece(bad, {6, 4, 10}, &back)) << bad;
  ASSERT_TRUE(decodePiece(";0:1", {}, &back));  // a scalar
}

}  // namespace
}  // namespace loom
