#include "train/StepDriver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "plan/PlanAttributes.h"
#include "plan/Zero1Parts.h"
#include "formats/Safetensors.h"

namespace loom {
namespace {

ArgumentView slice(const ArgumentView &flat, int64_t offset, int64_t count) {
  ArgumentView v;
  if (flat.h)
    v.h = flat.h + offset;
  else
    v.f = flat.f + offset;
  v.count = count;
  return v;
}

Status unbound(const plan::Program &prog, const plan::Binding &a, int mb) {
  return Status::error(prog.name() + ": nothing to bind to " + plan::Binding::Role_Name(a.role()) + " argument '" +
                       a.name() + "' (micro-batch " + std::to_string(mb) + "): the plan and the schedule disagree");
}

}  // namespace

// The labels were shifted before the cut, so each token keeps its next one. Each cp rank's loss
// is the mean over its own tokens, and the d x cp ranks' gradients are averaged
// (passes/ContextParallel.cpp): the sequence's mean only when every rank's chunks hold the same
// number of loss_mask tokens. A batch where they do not is refused, not trained on a silently
// different loss.
Status contextChunksOf(const std::map<std::string, HostTensor> &batch, const ContextChunks &chunks, int mb,
                       std::map<std::string, HostTensor> *result) {
  int64_t C = chunks.chunk();
  if (auto mask = batch.find("loss_mask"); mask != batch.end()) {
    const HostTensor &t = mask->second;
    int64_t count = t.shape.empty() ? 0 : t.shape[0];
    std::vector<double> perRank(chunks.c, 0.0);
    for (int64_t b = 0; b < count; ++b)
      for (int r = 0; r < chunks.c; ++r)
        for (int which = 0; which < 2; ++which) {
          int64_t from = b * chunks.seq + chunks.chunkOf(r, which) * C;
          for (int64_t i = from; i < from + C; ++i) perRank[r] += t.data[i];
        }
    for (int r = 1; r < chunks.c; ++r)
      if (perRank[r] != perRank[0])
        return Status::error("context parallelism: micro-batch " + std::to_string(mb) + "'s loss_mask holds " +
                             std::to_string(int64_t(perRank[0])) + " tokens in cp rank 0's chunks and " +
                             std::to_string(int64_t(perRank[r])) + " in cp rank " + std::to_string(r) +
                             "'s; each rank's mean loss averaged would not be the sequence's (use c = 1 for "
                             "data whose loss mask is not uniform)");
  }
  std::map<std::string, HostTensor> out;
  for (const auto &[name, t] : batch) {
    int64_t count = t.shape.empty() ? 0 : t.shape[0];
    HostTensor cut{{count, chunks.local()}};
    cut.isInt = t.isInt;
    for (int64_t b = 0; b < count; ++b)
      for (int which = 0; which < 2; ++which) {
        int64_t from = b * chunks.seq + chunks.chunkOf(chunks.rank, which) * C;
        if (t.isInt)
          cut.ints.insert(cut.ints.end(), t.ints.begin() + from, t.ints.begin() + from + C);
        else
          cut.data.insert(cut.data.end(), t.data.begin() + from, t.data.begin() + from + C);
      }
    out[name] = std::move(cut);
  }
  *result = std::move(out);
  return Status::ok();
}

uint64_t dropoutSeed(uint64_t seed, int64_t step, int dp, int mb) {
  uint64_t z = seed ^ (uint64_t(step) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(dp) << 40) ^ (uint64_t(mb) << 20);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t firstSampleOf(const plan::RankPlan &plan, int64_t step, int mb) {
  return ((step * plan.d() + plan.dp_rank()) * plan.micro_batches() + mb) * plan.micro_batch_size();
}

StepDriver::StepDriver(const plan::RankPlan &plan, const plan::ProgramSet &programs, StepBackend &backend,
                       Collectives *collectives, uint64_t seed)
    : plan_(plan), programs_(programs), backend_(backend), collectives_(collectives), seed_(seed) {}

Status StepDriver::init(const std::vector<HostTensor> &initial) {
  std::map<std::string, const plan::Program *> byName;
  for (const plan::Program &p : programs_.programs()) byName[p.name()] = &p;
  std::map<const plan::Program *, size_t> last, first;
  for (const plan::ScheduleEntry &e : plan_.schedule()) {
    auto it = byName.find(e.program());
    if (it == byName.end()) return Status::error("the schedule names program '" + e.program() + "', which the plan lacks");
    last[it->second] = entryProgram_.size();
    first.try_emplace(it->second, entryProgram_.size());
    entryProgram_.push_back(it->second);
  }
  for (size_t k = 0; k < entryProgram_.size(); ++k) {
    lastRun_.push_back(last[entryProgram_[k]] == k);
    firstRun_.push_back(first[entryProgram_[k]] == k);
  }
  for (const plan::Program &p : programs_.programs()) {
    if (p.kind() == plan::Program::PARAMETER_GATHER) gatherProgram_ = &p;
    if (p.kind() == plan::Program::GRADIENT_GATHER) gradientGatherProgram_ = &p;
  }
  // Only the inputs some program binds are uploaded and held (the memory plan's count): a
  // first pipeline stage takes no labels, a last one no tokens.
  for (const plan::Program &p : programs_.programs())
    for (const plan::Binding &a : p.arguments())
      if (a.role() == plan::Binding::INPUT) inputsRead_.insert(a.name());
  lastEntryOf_.resize(2);
  for (size_t k = 0; k < entryProgram_.size(); ++k) {
    int mb = plan_.schedule(int(k)).micro_batch();
    if (mb < 0) continue;
    lastEntryOf_[0][mb] = k;
    if (entryProgram_[k]->kind() == plan::Program::FORWARD) lastEntryOf_[1][mb] = k;
  }

  int64_t flat = plan_.flat_elements();
  for (const plan::Parameter &p : plan_.parameters()) {
    int64_t n = 1;
    for (int64_t d : p.shape()) n *= d;
    if (p.flat_offset() < 0 || p.flat_offset() + n > flat)
      return Status::error("parameter '" + p.name() + "' lies outside the flat buffer of " + std::to_string(flat) +
                           " elements (corrupt plan)");
    paramByName_[p.name()] = &p;
  }
  // ZeRO-1 in a 16-bit plan: the fp32 master weights are the rank's bucket parts only, in the
  // optimizer state (kMasterWeights), and no program binds the whole.
  mastersSharded_ = plan_.master_weights_sharded();
  if (!mastersSharded_) LOOM_RETURN_IF_ERROR(backend_.storage("parameters", flat, plan::F32, &params_));
  LOOM_RETURN_IF_ERROR(backend_.storage("gradients", flat, plan::F32, &grads_));
  LOOM_RETURN_IF_ERROR(backend_.storage("loss_sum", 1, plan::F32, &lossSums_["loss_sum"]));
  for (const plan::Program &prog : programs_.programs())  // the sums of the losses a loss sums (BERT's)
    for (const plan::Binding &a : prog.arguments())
      if (a.role() == plan::Binding::LOSS && !lossSums_.count(a.name()))
        LOOM_RETURN_IF_ERROR(backend_.storage(a.name(), 1, plan::F32, &lossSums_[a.name()]));
  // A 16-bit plan's programs compute with 16-bit copies of the fp32 master weights (its
  // 16-bit PARAMETER arguments): one flat copy, remade by the optimizer program after each
  // update and here whenever the masters are written from outside the step.
  computeDtype_ = planattr::computeDtype(programs_.programs());
  if (computeDtype_ != plan::F32) LOOM_RETURN_IF_ERROR(backend_.storage("parameters", flat, computeDtype_, &params16_));
  // The optimizer state and the scalars the programs name, the state sized by the views bound
  // to it (the furthest element any binding reaches).
  std::map<std::string, int64_t> stateExtent;
  for (const plan::Program &prog : programs_.programs())
    for (const plan::Binding &a : prog.arguments()) {
      int64_t extent = a.offset() + planattr::numel(prog.buffers(a.buffer()));
      if (a.offset() < 0 || (!a.part_of().empty() && a.role() != plan::Binding::PARAMETER && a.role() != plan::Binding::GRADIENT))
        return Status::error(prog.name() + ": argument '" + a.name() + "' is a view the step cannot bind (corrupt plan)");
      if (a.role() == plan::Binding::OPTIMIZER_STATE) stateExtent[a.name()] = std::max(stateExtent[a.name()], extent);
      if (a.role() == plan::Binding::HYPERPARAMETER && !hyper_.count(a.name()))
        LOOM_RETURN_IF_ERROR(slot("hyper/" + a.name(), prog.buffers(a.buffer()), &hyper_[a.name()]));
    }
  for (auto &[name, extent] : stateExtent)
    LOOM_RETURN_IF_ERROR(backend_.storage("optimizer/" + name, extent, plan::F32, &optimizerState_[name]));
  if (mastersSharded_) {
    auto masters = optimizerState_.find(kMasterWeights);
    if (computeDtype_ == plan::F32 || !gatherProgram_ || masters == optimizerState_.end())
      return Status::error("the plan shards the fp32 master weights, but its programs do not (corrupt plan)");
    masters_ = masters->second;
    parts_ = zero1Parts(plan_);
  }
  if (initial.size() != size_t(plan_.parameters_size())) return Status::error("initial parameters do not match the plan");
  for (int i = 0; i < plan_.parameters_size(); ++i)
    LOOM_RETURN_IF_ERROR(writeParameter(plan_.parameters(i).name(), initial[size_t(i)]));
  return parametersChanged();
}

Status StepDriver::writeParameter(const std::string &name, const HostTensor &values) {
  auto it = paramByName_.find(name);
  if (it == paramByName_.end()) return Status::error("the plan has no parameter '" + name + "'");
  int64_t begin = it->second->flat_offset(), n = 1;
  for (int64_t d : it->second->shape()) n *= d;
  if (values.isInt || int64_t(values.data.size()) != n)
    return Status::error("parameter '" + name + "': " + std::to_string(values.data.size()) + " values for " +
                         std::to_string(n) + " elements");
  if (!mastersSharded_) return backend_.upload(values, slice(params_, begin, n));
  // The parts of it this rank owns, each at its place in the sharded masters.
  for (const Zero1Part &part : parts_) {
    int64_t a = std::max(begin, part.flatBegin), z = std::min(begin + n, part.flatBegin + part.elements);
    if (a >= z) continue;
    HostTensor piece{{z - a}};
    piece.data.assign(values.data.begin() + (a - begin), values.data.begin() + (z - begin));
    LOOM_RETURN_IF_ERROR(backend_.upload(piece, slice(masters_, part.stateBegin + (a - part.flatBegin), z - a)));
  }
  return Status::ok();
}

Status StepDriver::view(const ArgumentView &storage, const plan::Program &prog, const plan::Binding &a,
                        ArgumentView *out) const {
  int64_t n = planattr::numel(prog.buffers(a.buffer())), start = a.offset();
  if (!a.part_of().empty()) {
    // ZeRO-1's groups (dp, dpcp, edp) as plan/Zero1Parts.h places a rank in them.
    int position = a.part_of() == "tp" ? plan_.tp_rank() : a.part_of() == "pp" ? plan_.pp_rank()
                   : a.part_of() == "cp" ? plan_.cp_rank()
                                         : zero1PartIndex(plan_, a.part_of());
    if (position < 0)
      return Status::error(prog.name() + ": argument '" + a.name() + "' is a part of group '" + a.part_of() +
                           "', which the step does not know (corrupt plan)");
    start += position * n;
  }
  if (start < 0 || start + n > storage.count)
    return Status::error(prog.name() + ": argument '" + a.name() + "' views elements [" + std::to_string(start) + ", " +
                         std::to_string(start + n) + ") of storage of " + std::to_string(storage.count) + " (corrupt plan)");
  *out = slice(storage, start, n);
  return Status::ok();
}

Status StepDriver::slot(const std::string &key, const plan::Buffer &buffer, ArgumentView *out) {
  return backend_.storage(key, planattr::numel(buffer), buffer.dtype(), out);
}

Status StepDriver::parametersChanged() {
  parametersStale_ = false;  // written whole
  if (computeDtype_ == plan::F32) return Status::ok();
  // Sharded masters: each rank casts its parts into the copies, which are then gathered (the
  // plan's parameter_gather, a collective over dp).
  if (mastersSharded_) return runOutsideSchedule(*gatherProgram_);
  return backend_.cast(params_, params16_, computeDtype_);
}

ArgumentView StepDriver::sliceOf(const ArgumentView &flat, const std::string &name) const {
  if (name == "flat") return flat;
  auto it = paramByName_.find(name);
  if (it == paramByName_.end()) return {};
  int64_t n = 1;
  for (int64_t d : it->second->shape()) n *= d;
  return slice(flat, it->second->flat_offset(), n);
}

Status StepDriver::bind(const plan::Program &prog, int mb, DataSource *data, int64_t step, bool evaluate,
                        std::vector<ArgumentView> *args) {
  args->clear();
  for (const plan::Binding &a : prog.arguments()) {
    const plan::Buffer &buffer = prog.buffers(a.buffer());
    ArgumentView v;
    switch (a.role()) {
      case plan::Binding::PARAMETER: {
        const ArgumentView &flat = buffer.dtype() == plan::F32 ? params_ : params16_;
        if (a.name() == "flat")
          LOOM_RETURN_IF_ERROR(view(flat, prog, a, &v));
        else
          v = sliceOf(flat, a.name());
        break;
      }
      case plan::Binding::GRADIENT:
        if (a.name() == "flat")
          LOOM_RETURN_IF_ERROR(view(grads_, prog, a, &v));
        else
          v = gradient(a.name());
        break;
      case plan::Binding::LOSS: {
        auto sum = lossSums_.find(a.name());
        if (sum == lossSums_.end())
          return Status::error(prog.name() + ": LOSS argument '" + a.name() + "' has no sum (corrupt plan)");
        v = sum->second;
        break;
      }
      case plan::Binding::OPTIMIZER_STATE: LOOM_RETURN_IF_ERROR(view(optimizerState_[a.name()], prog, a, &v)); break;
      case plan::Binding::HYPERPARAMETER: v = hyper_[a.name()]; break;
      case plan::Binding::STASH: {
        std::string pool = "stash/" + std::to_string(prog.virtual_stage());
        auto held = pools_[pool].held.find(mb);
        if (held == pools_[pool].held.end()) return unbound(prog, a, mb);  // no forward ran for it
        LOOM_RETURN_IF_ERROR(slot(pool + "/" + a.name() + "/" + std::to_string(held->second), buffer, &v));
        break;
      }
      case plan::Binding::INPUT: {
        if (mb < 0 || !data) return unbound(prog, a, mb);
        std::string inputSlot = std::to_string(pools_["inputs"].acquire(mb));
        if (!batchReady_[mb]) {
          std::map<std::string, HostTensor> batch =
              data->batch(firstSampleOf(plan_, step, mb), plan_.micro_batch_size(), plan_.seq_length());
          if (!dumpBatches_.empty() && !evaluate && plan_.tp_rank() == 0 && plan_.pp_rank() == 0 &&
              plan_.cp_rank() == 0) {  // the whole samples, before a context-parallel cut
            SafetensorsFile f;
            f.tensors = batch;
            char name[96];
            std::snprintf(name, sizeof name, "/batch_step%05lld_dp%03d_mb%04d.safetensors", (long long)step,
                          plan_.dp_rank(), mb);
            LOOM_RETURN_IF_ERROR(writeSafetensors(dumpBatches_ + name, f));
          }
          if (plan_.c() > 1)
            LOOM_RETURN_IF_ERROR(contextChunksOf(batch, ContextChunks{plan_.seq_length(), plan_.c(), plan_.cp_rank()},
                                                 mb, &batch));
          for (auto &[name, t] : batch) {
            if (!inputsRead_.count(name)) continue;
            ArgumentView input;
            LOOM_RETURN_IF_ERROR(backend_.storage("input/" + name + "/" + inputSlot,
                                                  t.isInt ? int64_t(t.ints.size()) : int64_t(t.data.size()),
                                                  t.isInt ? plan::I32 : plan::F32,
                                                  &input));
            LOOM_RETURN_IF_ERROR(backend_.upload(t, input));
          }
          batchReady_[mb] = true;
        }
        LOOM_RETURN_IF_ERROR(slot("input/" + a.name() + "/" + inputSlot, buffer, &v));
        break;
      }
      default:
        return unbound(prog, a, mb);
    }
    if (!v.f && !v.i && !v.h && v.count == 0 && planattr::numel(buffer) > 0) return unbound(prog, a, mb);
    args->push_back(v);
  }
  return Status::ok();
}

Status StepDriver::runEntry(size_t entry, DataSource *data, int64_t step, bool evaluate) {
  const plan::Program &prog = *entryProgram_[entry];
  int mb = plan_.schedule(int(entry)).micro_batch();
  std::vector<ArgumentView> args;
  LOOM_RETURN_IF_ERROR(bind(prog, mb, data, step, evaluate, &args));
  ExecutionContext ctx;
  ctx.collectives = collectives_;
  ctx.seed = dropoutSeed(seed_, step, plan_.dp_rank(), mb < 0 ? 0 : mb);
  ctx.messageTag = mb < 0 ? 0 : mb * kTagsPerMicroBatch;
  ctx.training = !evaluate;
  ctx.lossScale = evaluate ? 1.0f : lossScale_;
  ctx.moeTally = evaluate ? nullptr : &moeTally_;
  ctx.moeRouting = evaluate || !logRouting_ ? nullptr : &moeRouting_;
  ctx.lastRun = lastRun_[entry];
  ctx.firstRun = firstRun_[entry];
  ctx.progress = progress_;
  ctx.microBatch = mb;
  if (!evaluate && step == stallStep_) ctx.testStallOp = stallOp_.c_str();
  ctx.testSlowdown = slowdown_;
  if (!evaluate) ctx.trace = trace_, ctx.traceMicroBatch = mb;
  // Each result's slot, known before the run: the backend may compute a result straight into
  // it (the CPU backend does), and consume then finds it in place.
  std::vector<ArgumentView> resultSlots(size_t(prog.results_size()));
  std::vector<float *> resultPointers(size_t(prog.results_size()), nullptr);
  std::vector<uint16_t *> halfPointers(size_t(prog.results_size()), nullptr);
  for (int i = 0; i < prog.results_size(); ++i) {
    const plan::Binding &r = prog.results(i);
    if (r.role() == plan::Binding::STASH) {
      std::string pool = "stash/" + std::to_string(prog.virtual_stage());
      LOOM_RETURN_IF_ERROR(slot(pool + "/" + r.name() + "/" + std::to_string(pools_[pool].acquire(mb)),
                                prog.buffers(r.buffer()), &resultSlots[size_t(i)]));
    } else if (r.role() == plan::Binding::METRIC) {
      LOOM_RETURN_IF_ERROR(slot("metric/" + r.name(), prog.buffers(r.buffer()), &resultSlots[size_t(i)]));
    } else {
      return Status::error(prog.name() + ": result '" + r.name() + "' has no place in the step (corrupt plan)");
    }
    resultPointers[size_t(i)] = resultSlots[size_t(i)].f;
    halfPointers[size_t(i)] = resultSlots[size_t(i)].h;
  }
  ctx.resultSlots = &resultPointers;
  ctx.halfResultSlots = &halfPointers;
  Status consumed;
  auto consume = [&](int i, const float *from, int64_t n) {
    const ArgumentView &to = resultSlots[size_t(i)];
    ArgumentView wide;
    wide.f = const_cast<float *>(from), wide.count = n;
    Status st = to.h ? backend_.cast(wide, to, prog.buffers(prog.results(i).buffer()).dtype()) : backend_.copy(from, n, to.f);
    if (!st.isOk() && consumed.isOk()) consumed = st;
  };
  LOOM_RETURN_IF_ERROR(backend_.run(prog, args, consume, ctx));
  LOOM_RETURN_IF_ERROR(consumed);
  // Slots this run was the last to need go back to their pools (after the backend is done
  // with them: the next program runs after this one on every backend).
  std::string stash = "stash/" + std::to_string(prog.virtual_stage());
  if (prog.kind() == plan::Program::BACKWARD || (evaluate && prog.kind() == plan::Program::FORWARD))
    pools_[stash].release(mb);
  auto last = lastEntryOf_[evaluate ? 1 : 0].find(mb);
  if (last != lastEntryOf_[evaluate ? 1 : 0].end() && last->second == entry) pools_["inputs"].release(mb);
  return Status::ok();
}

int StepDriver::SlotPool::acquire(int mb) {
  auto it = held.find(mb);
  if (it != held.end()) return it->second;
  int slot = next;
  if (!free.empty())
    slot = free.back(), free.pop_back();
  else
    ++next;
  return held[mb] = slot;
}

void StepDriver::SlotPool::release(int mb) {
  auto it = held.find(mb);
  if (it == held.end()) return;
  free.push_back(it->second);
  held.erase(it);
}

Status StepDriver::readMetric(const plan::Program &prog, const std::string &name, double *value) {
  for (const plan::Binding &r : prog.results())
    if (r.role() == plan::Binding::METRIC && r.name() == name) {
      ArgumentView v;
      LOOM_RETURN_IF_ERROR(slot("metric/" + name, prog.buffers(r.buffer()), &v));
      std::vector<float> host;
      LOOM_RETURN_IF_ERROR(backend_.synchronize());
      LOOM_RETURN_IF_ERROR(backend_.download(v, &host));
      *value = host.at(0);
      return Status::ok();
    }
  return Status::error(prog.name() + ": no metric '" + name + "' (corrupt plan)");
}

Status StepDriver::runGradients(DataSource *data, int64_t step, bool evaluate, bool *hasLoss, double *loss) {
  batchReady_.clear();
  backend_.beginStep();
  for (auto &[name, pool] : pools_) {  // nothing is held across steps (an aborted step's slots return)
    for (auto &[mb, slot] : pool.held) pool.free.push_back(slot);
    pool.held.clear();
  }
  *hasLoss = false;
  for (size_t k = 0; k < entryProgram_.size(); ++k) {
    const plan::Program &prog = *entryProgram_[k];
    if (prog.kind() == plan::Program::OPTIMIZER || (evaluate && prog.kind() == plan::Program::BACKWARD)) continue;
    LOOM_RETURN_IF_ERROR(runEntry(k, data, step, evaluate));
    if (prog.kind() == plan::Program::LOSS) {
      LOOM_RETURN_IF_ERROR(readMetric(prog, "loss", loss));
      *hasLoss = true;
      lossTerms_.clear();
      for (const plan::Binding &r : prog.results())
        if (r.role() == plan::Binding::METRIC && r.name() != "loss") {
          double term = 0;
          LOOM_RETURN_IF_ERROR(readMetric(prog, r.name(), &term));
          lossTerms_.emplace_back(r.name(), term);
        }
    }
  }
  LOOM_RETURN_IF_ERROR(backend_.synchronize());
  // ZeRO-1: the forwards' first runs gathered every bucket; in a 16-bit plan only the 16-bit
  // copies, so the fp32 masters wait for gatherParameters.
  if (computeDtype_ == plan::F32) parametersStale_ = false;
  if (!collectives_) return Status::ok();
  if (progress_) progress_->waitingOutside("the delivery of the step's pipeline sends");
  Status flushed = collectives_->flush();
  if (progress_) progress_->waitingOutside("");
  return flushed;
}

Status StepDriver::runOptimizer(const OptimizerScalars &s, double *gradNorm) {
  std::map<std::string, double> values = {{"learning_rate", s.learningRate}, {"adam_step", double(s.adamStep)},
                                          {"clip_grad", s.clipGrad},         {"loss_scale", s.lossScale},
                                          {"weight_decay", s.weightDecay},   {"adam_beta1", s.beta1},
                                          {"adam_beta2", s.beta2},           {"adam_eps", s.eps}};
  for (auto &[name, view] : hyper_) {
    auto it = values.find(name);
    if (it == values.end()) return Status::error("the optimizer program takes hyperparameter '" + name + "', unknown to this build");
    HostTensor t{{}};
    t.data = {float(it->second)};
    LOOM_RETURN_IF_ERROR(backend_.upload(t, view));
  }
  bool ran = false;
  for (size_t k = 0; k < entryProgram_.size(); ++k) {
    if (entryProgram_[k]->kind() != plan::Program::OPTIMIZER) continue;
    LOOM_RETURN_IF_ERROR(runEntry(k, nullptr, 0, false));
    LOOM_RETURN_IF_ERROR(readMetric(*entryProgram_[k], "grad_norm", gradNorm));
    ran = true;
  }
  if (!ran) return Status::error("the plan has no optimizer program in its schedule");
  parametersStale_ = gatherProgram_ && !mastersSharded_;  // each rank updated its own parts only
  return Status::ok();
}

Status StepDriver::runOutsideSchedule(const plan::Program &program) {
  std::vector<ArgumentView> args;
  LOOM_RETURN_IF_ERROR(bind(program, -1, nullptr, 0, /*evaluate=*/false, &args));
  ExecutionContext ctx;
  ctx.collectives = collectives_;
  ctx.progress = progress_;
  std::vector<float *> noSlots;
  std::vector<uint16_t *> noHalfSlots;
  ctx.resultSlots = &noSlots, ctx.halfResultSlots = &noHalfSlots;
  LOOM_RETURN_IF_ERROR(backend_.run(program, args, [](int, const float *, int64_t) {}, ctx));
  return backend_.synchronize();
}

Status StepDriver::gatherParameters() {
  if (mastersSharded_)
    return Status::error("the fp32 master weights are sharded over the data-parallel ranks (ZeRO-1 in a 16-bit "
                         "plan): read them through a checkpoint");
  if (!parametersStale_ || !gatherProgram_) return Status::ok();
  LOOM_RETURN_IF_ERROR(runOutsideSchedule(*gatherProgram_));
  parametersStale_ = false;
  return Status::ok();
}

Status StepDriver::gatherGradients() {
  return gradientGatherProgram_ ? runOutsideSchedule(*gradientGatherProgram_) : Status::ok();
}

}  // namespace loom
