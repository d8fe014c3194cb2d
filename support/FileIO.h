// Reading a whole file, with one error text for every reader of the project's files.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "support/Status.h"

namespace loom {

// All of the file at `path` into *bytes. `what` is the file's role, for the error:
// "PATH: cannot read WHAT: REASON" (the system's reason: no such file, a directory, ...).
// `progress`, when given, is told the bytes read so far and the file's size as reading goes.
using ByteProgress = std::function<void(int64_t done, int64_t total)>;
Status readWholeFile(const std::string &path, const char *what, std::string *bytes, const ByteProgress &progress = {});

}  // namespace loom
