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

}  // namespace loom
