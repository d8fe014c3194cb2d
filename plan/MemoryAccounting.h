// A rank's memory part by part, in Megatron's terms (weights and optimizer by dtype,
// activations of the micro-batches in flight, workspace, communication buffers, the backend's
// additions): the one accounting behind the compiler's memory plan and its refusal, loom-dump's
// memory report, loomc simulate's fit check and loomc search's estimate.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plan/Schedule.h"
#include "protos/plan.pb.h"

namespace loom::memory {

// Weights and optimizer of a stage whose flat parameter buffer has `flatElements` values:
// fp32 master weights and main gradients, AdamW's two fp32 moments over `optimizerElements`
// (ZeRO-1: the rank's part of every bucket, 1/d of the flat buffer or 1/(d / ep) of an expert
// bucket; else all of it), and a 16-bit plan's copy of the weights it computes with (its
// `compute` dtype; none for fp32). mastersSharded (ZeRO-1 in a 16-bit plan): the master weights
// are over `optimizerElements` too. Adds to what `mem` already holds (the backend's copies).
void accountWeights(int64_t flatElements, plan::DType compute, int64_t optimizerElements, bool mastersSharded,
                    plan::MemoryPlan *mem);

// What a stage's schedule walk needs: per chunk the bytes one micro-batch's forward keeps for
// its backward, the bytes of one micro-batch's inputs (held from its first program to its
// last), and the largest program's arena (and its name).
struct StageActivations {
  std::vector<int64_t> stashPerChunk;
  int64_t inputsPerMicroBatch = 0;
  int64_t workspace = 0;
  std::string workspaceProgram;
};

// Walks the stage's schedule (then `onceEntries` programs that run once per step: the loss, the
// optimizer): per entry the bytes held (everything held all step, the stashes of the chunk
// forwards in flight, the inputs of the micro-batches in flight, the largest arena) into
// timeline_bytes, and the peaks (stash, inputs, chunks in flight, total). Call after
// accountWeights and the backend's parts.
void accountActivations(const StageSchedule &tasks, const StageActivations &stage, int onceEntries,
                        plan::MemoryPlan *mem);

// The step's scalars the step driver (train/StepDriver.cpp) holds all step for these programs:
// a slot per hyperparameter and metric they name, and a sum per loss ("loss_sum" always, one
// per term of a loss that sums several, BERT's).
int64_t stepScalarBytes(const google::protobuf::RepeatedPtrField<plan::Program> &programs);

// Bytes held all step: weights, gradients, optimizer, 16-bit weight copies, kernel scratch,
// pipeline message slots, the step's scalars.
int64_t heldAllStep(const plan::MemoryPlan &mem);

// Adds bytes held all step after the walk (the CUDA backend's pipeline message slots).
void addHeldAllStep(int64_t bytes, plan::MemoryPlan *mem);

// The parts with the names the refusal and the report use, largest first.
std::vector<std::pair<int64_t, std::string>> namedParts(const plan::MemoryPlan &mem);

// Micro-batches' worth of stash held at the peak: peak_stash / stash per micro-batch (Megatron's
// in-flight count: p on 1F1B's first stage, p (1 + (p - 1) / (p v)) interleaved).
double microBatchesInFlight(const plan::MemoryPlan &mem);

}  // namespace loom::memory
