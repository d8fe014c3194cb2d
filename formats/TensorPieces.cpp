#include "formats/TensorPieces.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace loom {

int64_t TensorPiece::blockElements() const {
  int64_t n = 1;
  for (size_t k = 0; k < begin.size(); ++k) n *= end[k] - begin[k];
  return n;
}

TensorPiece shardPiece(const std::vector<int64_t> &globalShape, int shardDim, int parts, int index) {
  TensorPiece p;
  p.begin.assign(globalShape.size(), 0);
  p.end = globalShape;
  if (shardDim >= 0 && size_t(shardDim) < globalShape.size() && parts > 1) {
    int64_t size = globalShape[size_t(shardDim)] / parts;
    p.begin[size_t(shardDim)] = int64_t(index) * size;
    p.end[size_t(shardDim)] = int64_t(index + 1) * size;
  }
  p.flatEnd = p.blockElements();
  return p;
}

int64_t copyOverlap(const TensorPiece &src, const float *srcData, const TensorPiece &dst, float *dstData) {
  const size_t rank = src.begin.size();
  if (rank != dst.begin.size()) return 0;
  if (rank == 0) {  // a scalar
    if (src.elements() > 0 && dst.elements() > 0) {
      if (dstData && srcData) dstData[0] = srcData[0];
      return 1;
    }
    return 0;
  }
  // The blocks' intersection: empty means nothing to copy.
  std::vector<int64_t> lo(rank), hi(rank);
  for (size_t k = 0; k < rank; ++k) {
    lo[k] = std::max(src.begin[k], dst.begin[k]), hi[k] = std::min(src.end[k], dst.end[k]);
    if (lo[k] >= hi[k]) return 0;
  }
  auto extent = [](const TensorPiece &p, size_t k) { return p.end[k] - p.begin[k]; };
  const size_t last = rank - 1;
  // Walk the rows (every dimension but the last) of the intersection; each row is one run of
  // [lo[last], hi[last]) in both blocks, clipped by both flat ranges.
  std::vector<int64_t> at(lo.begin(), lo.end());
  int64_t copied = 0;
  while (true) {
    int64_t srcRow = 0, dstRow = 0;
    for (size_t k = 0; k < last; ++k) {
      srcRow = srcRow * extent(src, k) + (at[k] - src.begin[k]);
      dstRow = dstRow * extent(dst, k) + (at[k] - dst.begin[k]);
    }
    int64_t srcStart = srcRow * extent(src, last) + (lo[last] - src.begin[last]);
    int64_t dstStart = dstRow * extent(dst, last) + (lo[last] - dst.begin[last]);
    int64_t n = hi[last] - lo[last];
    // Clip [0, n) so that srcStart + i is in src's flat range and dstStart + i in dst's.
    int64_t from = std::max({int64_t(0), src.flatBegin - srcStart, dst.flatBegin - dstStart});
    int64_t to = std::min({n, src.flatEnd - srcStart, dst.flatEnd - dstStart});
    if (from < to) {
      if (dstData && srcData)
        std::memcpy(dstData + (dstStart + from - dst.flatBegin), srcData + (srcStart + from - src.flatBegin),
                    size_t(to - from) * sizeof(float));
      copied += to - from;
    }
    // The next row of the intersection (odometer over dimensions last-1 .. 0).
    size_t k = last;
    while (k > 0) {
      --k;
      if (++at[k] < hi[k]) break;
      at[k] = lo[k];
      if (k == 0) return copied;
    }
    if (last == 0) return copied;
  }
}

std::string encodePiece(const TensorPiece &piece) {
  std::string s;
  for (size_t k = 0; k < piece.begin.size(); ++k)
    s += (k ? "," : "") + std::to_string(piece.begin[k]) + ":" + std::to_string(piece.end[k]);
  return s + ";" + std::to_string(piece.flatBegin) + ":" + std::to_string(piece.flatEnd);
}

namespace {
// "a:b" -> a, b (non-negative decimal integers).
bool parseRange(const std::string &text, int64_t *a, int64_t *b) {
  size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size()) return false;
  for (size_t i = 0; i < text.size(); ++i)
    if (i != colon && (text[i] < '0' || text[i] > '9')) return false;
  if (colon > 18 || text.size() - colon - 1 > 18) return false;  // no overflow
  *a = std::strtoll(text.substr(0, colon).c_str(), nullptr, 10);
  *b = std::strtoll(text.substr(colon + 1).c_str(), nullptr, 10);
  return true;
}
}  // namespace

bool decodePiece(const std::string &text, const std::vector<int64_t> &globalShape, TensorPiece *piece) {
  size_t semi = text.rfind(';');
  if (semi == std::string::npos) return false;
  TensorPiece p;
  std::string block = text.substr(0, semi);
  for (size_t i = 0; i < block.size() || (i == 0 && !globalShape.empty());) {
    size_t comma = block.find(',', i);
    std::string range = block.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
    int64_t b, e;
    if (!parseRange(range, &b, &e)) return false;
    p.begin.push_back(b), p.end.push_back(e);
    if (comma == std::string::npos) break;
    i = comma + 1;
  }
  if (p.begin.size() != globalShape.size()) return false;
  for (size_t k = 0; k < globalShape.size(); ++k)
    if (p.begin[k] >= p.end[k] || p.end[k] > globalShape[k]) return false;
  if (!parseRange(text.substr(semi + 1), &p.flatBegin, &p.flatEnd)) return false;
  if (p.flatBegin > p.flatEnd || p.flatEnd > p.blockElements()) return false;
  *piece = std::move(p);
  return true;
}

}  // namespace loom
