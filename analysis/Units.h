// Human-readable quantities for summaries and dumps.
#pragma once

#include <string>

#include "llvm/Support/FormatVariadic.h"

namespace loom {

// 1536 -> "1.5 KiB"
inline std::string humanBytes(double bytes) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024 && i < 4) bytes /= 1024, ++i;
  return llvm::formatv("{0:F1} {1}", bytes, unit[i]).str();
}

// 1.2345 -> "1.234 s", 0.0056 -> "5.600 ms", 9e-6 -> "9.0 us"
inline std::string humanSeconds(double s) {
  if (s >= 1) return llvm::formatv("{0:F3} s", s).str();
  if (s >= 1e-3) return llvm::formatv("{0:F3} ms", s * 1e3).str();
  return llvm::formatv("{0:F1} us", s * 1e6).str();
}

}  // namespace loom
