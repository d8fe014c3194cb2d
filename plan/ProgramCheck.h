// What every reader of a plan checks of a program before running or analysing it: streams,
// event order, buffer ids, writes only to inout arguments, and every instruction against its
// declaration (plan/InstructionSet.h); a one-line error naming the program otherwise.
#pragma once

#include <cstdint>

#include "protos/plan.pb.h"
#include "support/Status.h"

namespace loom {

// Pipeline messages of micro-batch mb use their own tag range: messageTag = mb * this (the
// executors add it to a send's or recv's tag; the checker matches messages by it).
constexpr int64_t kTagsPerMicroBatch = 1 << 12;

Status checkProgram(const plan::Program &program);
// The structure alone (streams, events, buffer ids, inout writes), without the declarations:
// what an executor checks on every run of a program it was given already checked (each
// instruction's operands are still bound to their declared slots when it runs).
Status checkProgramStructure(const plan::Program &program);

}  // namespace loom
