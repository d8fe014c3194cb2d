// Shared pieces of the fuzz harnesses (fuzz/*_fuzzer.cpp): every harness defines
// LLVMFuzzerTestOneInput and is linked either with libFuzzer (`./loom fuzz`, clang-19 with
// AddressSanitizer and UndefinedBehaviorSanitizer) or with CorpusDriver.cpp, which replays the
// committed seed corpus once in the ordinary build (a test in `./loom test`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace loom::fuzz {

// A scratch path private to this process (on /dev/shm when it exists): readers that take a
// file name get the input through it.
std::string scratchPath(const std::string &name);
void writeScratch(const std::string &path, const uint8_t *data, size_t size);
void writeScratch(const std::string &path, const std::string &bytes);

// Two inputs from one: the first two bytes give the first part's length (modulo what is left).
std::pair<std::string, std::string> splitInput(const uint8_t *data, size_t size);

// A harness's own invariant broke (not a rejected input): print it and abort, which libFuzzer
// and the corpus driver both report as a crash.
[[noreturn]] void invariantBroken(const std::string &what);

}  // namespace loom::fuzz
