#include "plan/MemoryAccounting.h"

#include <algorithm>
#include <map>

namespace loom::memory {

namespace {
int64_t elementBytes(plan::DType t) { return t == plan::BF16 || t == plan::F16 ? 2 : 4; }
}  // namespace

void accountWeights(int64_t flatElements, plan::DType compute, int64_t optimizerElements, bool mastersSharded,
                    plan::MemoryPlan *mem) {
  mem->set_parameter_bytes(4 * (mastersSharded ? optimizerElements : flatElements));
  mem->set_gradient_bytes(4 * flatElements);
  mem->set_optimizer_bytes(2 * 4 * optimizerElements);
  if (compute != plan::F32) mem->set_half_weight_bytes(mem->half_weight_bytes() + elementBytes(compute) * flatElements);
}

int64_t stepScalarBytes(const google::protobuf::RepeatedPtrField<plan::Program> &programs) {
  std::map<std::string, int64_t> slots = {{"loss_sum", 4}};  // by the step driver's storage key
  for (const plan::Program &prog : programs) {
    for (const plan::Binding &a : prog.arguments())
      if (a.role() == plan::Binding::HYPERPARAMETER)
        slots["hyper/" + a.name()] = prog.buffers(a.buffer()).bytes();
      else if (a.role() == plan::Binding::LOSS)
        slots[a.name()] = 4;
    for (const plan::Binding &r : prog.results())
      if (r.role() == plan::Binding::METRIC) slots["metric/" + r.name()] = prog.buffers(r.buffer()).bytes();
  }
  int64_t bytes = 0;
  for (auto &[key, b] : slots) bytes += b;
  return bytes;
}

int64_t heldAllStep(const plan::MemoryPlan &mem) {
  return mem.parameter_bytes() + mem.gradient_bytes() + mem.optimizer_bytes() + mem.half_weight_bytes() +
         mem.scratch_bytes() + mem.pipeline_slot_bytes() + mem.step_scalar_bytes();
}

void accountActivations(const StageSchedule &tasks, const StageActivations &stage, int onceEntries,
                        plan::MemoryPlan *mem) {
  int64_t persistent = heldAllStep(*mem), perMicroBatch = 0;
  for (int64_t s : stage.stashPerChunk) perMicroBatch += s;
  auto stashOf = [&](const Task &t) {
    return t.chunk >= 0 && size_t(t.chunk) < stage.stashPerChunk.size() ? stage.stashPerChunk[size_t(t.chunk)] : 0;
  };
  std::map<int, std::pair<size_t, size_t>> spanOf;  // micro-batch -> (first, last) entry
  for (size_t k = 0; k < tasks.size(); ++k) {
    auto [it, fresh] = spanOf.try_emplace(tasks[k].microBatch, std::make_pair(k, k));
    it->second.second = k;
  }
  int64_t stash = 0, peakStash = 0, peakInputs = 0, peak = 0;
  int chunks = 0, peakChunks = 0;
  mem->clear_timeline_bytes();
  for (size_t k = 0; k < tasks.size(); ++k) {
    const Task &task = tasks[k];
    int64_t inFlight = 0;
    for (auto &[mb, span] : spanOf) inFlight += span.first <= k && k <= span.second;
    // During the entry its stash is held (made by a forward, read by a backward).
    if (task.type == Task::kForward) stash += stashOf(task), ++chunks;
    int64_t held = persistent + stash + inFlight * stage.inputsPerMicroBatch + stage.workspace;
    if (stash > peakStash) peakStash = stash, peakChunks = chunks;
    if (task.type == Task::kBackward) stash -= stashOf(task), --chunks;
    peakInputs = std::max(peakInputs, inFlight * stage.inputsPerMicroBatch);
    peak = std::max(peak, held);
    mem->add_timeline_bytes(held);
  }
  for (int k = 0; k < onceEntries; ++k) {
    mem->add_timeline_bytes(persistent + stage.workspace);
    peak = std::max(peak, persistent + stage.workspace);
  }
  mem->set_peak_stash_bytes(peakStash);
  mem->set_peak_stash_chunks(peakChunks);
  mem->set_stash_bytes_per_micro_batch(perMicroBatch);
  mem->set_chunks(int(stage.stashPerChunk.size()));
  mem->set_peak_input_bytes(peakInputs);
  mem->set_max_workspace_bytes(stage.workspace);
  mem->set_workspace_program(stage.workspaceProgram);
  mem->set_peak_bytes(peak);
}

void addHeldAllStep(int64_t bytes, plan::MemoryPlan *mem) {
  for (int k = 0; k < mem->timeline_bytes_size(); ++k) mem->set_timeline_bytes(k, mem->timeline_bytes(k) + bytes);
  mem->set_peak_bytes(mem->peak_bytes() + bytes);
}

std::vector<std::pair<int64_t, std::string>> namedParts(const plan::MemoryPlan &m) {
  std::vector<std::pair<int64_t, std::string>> parts = {{m.parameter_bytes(), "parameters"},
                                                        {m.gradient_bytes(), "gradients"},
                                                        {m.optimizer_bytes(), "AdamW state"},
                                                        {m.peak_stash_bytes(), "stashed activations"},
                                                        {m.peak_input_bytes(), "micro-batch inputs"},
                                                        {m.half_weight_bytes(), "16-bit weight copies"},
                                                        {m.scratch_bytes(), "kernel scratch"},
                                                        {m.pipeline_slot_bytes(), "pipeline message slots"},
                                                        {m.step_scalar_bytes(), "step scalars"},
                                                        {m.max_workspace_bytes(), "workspace"}};
  std::stable_sort(parts.begin(), parts.end(), [](auto &a, auto &b) { return a.first > b.first; });
  return parts;
}

double microBatchesInFlight(const plan::MemoryPlan &mem) {
  return mem.stash_bytes_per_micro_batch() > 0
             ? double(mem.peak_stash_bytes()) / double(mem.stash_bytes_per_micro_batch())
             : 0.0;
}

}  // namespace loom::memory
