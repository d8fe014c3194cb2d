#include "runtime/cuda/CudaTrainer.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "runtime/ParamInit.h"
#include "runtime/PlanAttributes.h"
#include "runtime/Trainer.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/CudaStatus.h"
#include "runtime/cuda/GradUnscale.h"
#include "runtime/cuda/NcclGroup.h"
#include "runtime/cuda/PipelineLinks.h"

namespace loom::cuda {

struct CudaTrainer::Array {
  void *data = nullptr;
  size_t bytes = 0;
  Array() = default;
  Array(const Array &) = delete;
  Array &operator=(const Array &) = delete;
  Array(Array &&o) noexcept : data(o.data), bytes(o.bytes) { o.data = nullptr, o.bytes = 0; }
  ~Array() {
    if (data) cudaFree(data);
  }
  Status allocate(size_t n, const std::string &what) {
    bytes = n;
    return cudaStatus(cudaMalloc(&data, n ? n : 4), "allocating " + std::to_string(n) + " bytes for " + what);
  }
  float *f() const { return static_cast<float *>(data); }
};

struct CudaTrainer::Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t count;
  bool decay, counted;  // AdamW weight decay; counted once in the global gradient norm
  Array value, grad, m, v;
};

CudaTrainer::CudaTrainer(plan::RankPlan plan, plan::ProgramSet programs, Collectives *collectives, DataSource *data,
                         const CudaTrainerOptions &options)
    : plan_(std::move(plan)), programs_(std::move(programs)), collectives_(collectives), data_(data), opt_(options),
      scaler_(options.lossScaling) {}

CudaTrainer::~CudaTrainer() {
  cudaDeviceSynchronize();
  executor_.reset();
  for (auto &[name, where] : bucketOf_) cudaEventDestroy(where.second);
  if (syncDone_) cudaEventDestroy(syncDone_);
  if (syncStream_) cudaStreamDestroy(syncStream_);
  if (lossHost_) cudaFreeHost(lossHost_);
  for (auto &[key, stage] : staging_) cudaFreeHost(stage.data);
  if (squares_) cudaFree(squares_);
  if (nonFinite_) cudaFree(nonFinite_);
  for (float *p : {zero_.flat, zero_.grad, zero_.m, zero_.v, zero_.counted, zero_.decayed})
    if (p) cudaFree(p);
}

Status CudaTrainer::create(plan::RankPlan plan, plan::ProgramSet programs, Collectives *collectives,
                           const NcclGroups *groups, DataSource *data, const CudaTrainerOptions &options,
                           std::unique_ptr<CudaTrainer> *out, const std::map<std::string, HostTensor> *initial) {
  if (plan.p() > 1 && !options.links)
    return Status::error("pipeline_parallel_size " + std::to_string(plan.p()) +
                         ": a pipeline plan needs PipelineLinks between the stages (loom-rank creates them)");
  if (!collectives || !data) return Status::error("the CUDA trainer needs collectives and a data source");
  if (options.precision == Precision::kFp16) LOOM_RETURN_IF_ERROR(LossScaler::validate(options.lossScaling));
  std::unique_ptr<CudaTrainer> t(new CudaTrainer(std::move(plan), std::move(programs), collectives, data, options));
  for (const plan::Program &p : t->programs_.programs()) t->byName_[p.name()] = &p;
  CudaExecutorOptions executorOptions;
  executorOptions.precision = options.precision, executorOptions.attention = options.attention;
  executorOptions.groups = groups, executorOptions.links = options.links;
  LOOM_RETURN_IF_ERROR(CudaExecutor::create(executorOptions, &t->executor_));
  cudaStream_t s = t->executor_->computeStream();
  // The CPU trainer's weights, element for element.
  const auto &parameters = t->plan_.parameters();
  std::vector<HostTensor> drawn;
  if (!initial) drawn = initParameters(t->plan_, options.seed);
  for (int i = 0; i < parameters.size(); ++i) {
    const plan::Parameter &p = parameters[i];
    HostTensor init = !initial                          ? std::move(drawn[size_t(i)])
                      : initial->count(p.name()) ? initial->at(p.name())
                                                 : initParameter(p, options.seed);
    if (init.numel() != int64_t(init.data.size()))
      return Status::error("the initial value of parameter " + p.name() + " has the wrong size");
    Param param{p.name(), init.shape, init.numel(), decays(p.name(), init.shape),
                p.tied_to().empty() && (p.shard_dim() >= 0 || t->plan_.tp_rank() == 0)};
    size_t bytes = size_t(param.count) * sizeof(float);
    for (Array *a : {&param.value, &param.grad, &param.m, &param.v}) LOOM_RETURN_IF_ERROR(a->allocate(bytes, p.name()));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpy(param.value.data, init.data.data(), bytes, cudaMemcpyHostToDevice),
                                    "uploading " + p.name()));
    for (Array *a : {&param.m, &param.v})
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(a->data, 0, bytes, s), "zeroing AdamW state"));
    t->paramIndex_[p.name()] = t->params_.size();
    t->params_.push_back(std::move(param));
  }
  LOOM_RETURN_IF_ERROR(t->planOverlappedSync(groups));
  LOOM_RETURN_IF_ERROR(t->planZero(groups));
  LOOM_RETURN_IF_ERROR(t->executor_->prepare(t->programs_));
  LOOM_RETURN_IF_ERROR(t->preallocate());
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMallocHost(&t->lossHost_, sizeof(float) * size_t(std::max(1, t->plan_.micro_batches()))),
                                  "pinned loss buffer"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&t->squares_, sizeof(double)), "norm accumulator"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&t->nonFinite_, sizeof(int32_t)), "overflow flag"));
  // The uploads above ran on the legacy stream, which the executor's non-blocking streams do
  // not wait for: the device drains before the first step.
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaDeviceSynchronize(), "initialising the trainer"));
  *out = std::move(t);
  return Status::ok();
}

// Every stash, input and backward-output array (and the inputs' pinned staging) of a step, made
// before the first: nothing is allocated mid-step, and in a pipeline nothing drains the device
// while a peer waits on this rank.
Status CudaTrainer::preallocate() {
  for (const plan::ScheduleEntry &e : plan_.schedule()) {
    auto it = byName_.find(e.program());
    if (it == byName_.end()) continue;  // runSchedule names it
    const plan::Program &prog = *it->second;
    Array *a;
    for (const plan::Binding &b : prog.arguments())
      if (b.role() == plan::Binding::INPUT) {
        size_t bytes = size_t(planattr::numel(prog.buffers(b.buffer()))) * 4;
        LOOM_RETURN_IF_ERROR(slot(inputs_, b.name(), e.micro_batch(), bytes, false, &a));
        Pinned &stage = staging_[{b.name(), e.micro_batch()}];
        if (!stage.data)
          LOOM_RETURN_IF_ERROR(cudaStatus(cudaMallocHost(&stage.data, bytes), "pinned staging for " + b.name()));
        stage.bytes = bytes;
      }
    for (const plan::Binding &r : prog.results())
      if (r.role() == plan::Binding::STASH) {
        size_t bytes = size_t(planattr::numel(prog.buffers(r.buffer()))) * sizeof(float);
        if (prog.kind() == plan::Program::FORWARD)
          LOOM_RETURN_IF_ERROR(slot(stash_, r.name(), e.micro_batch(), bytes, false, &a));
        else if (prog.kind() == plan::Program::BACKWARD)
          LOOM_RETURN_IF_ERROR(slot(backwardOut_, r.name(), -1, bytes, true, &a));
      }
  }
  return Status::ok();
}

// The device array of (name, mb), made by preallocate (a later size change re-makes it).
Status CudaTrainer::slot(std::map<std::pair<std::string, int>, Array> &in, const std::string &name, int mb,
                         size_t bytes, bool zeroed, Array **out) {
  Array &a = in[{name, mb}];
  *out = &a;
  if (a.data && a.bytes == bytes) return Status::ok();
  if (a.data) {
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaDeviceSynchronize(), "synchronize before resizing " + name));
    cudaFree(a.data), a.data = nullptr;
  }
  LOOM_RETURN_IF_ERROR(a.allocate(bytes, name));
  if (!zeroed) return Status::ok();
  return cudaStatus(cudaMemsetAsync(a.data, 0, bytes, executor_->computeStream()), "zeroing " + name);
}

// Buckets from a grad-sync program made only of all_reduce instructions whose operands are
// backward outputs (STASH arguments) and whose results are gradients; anything else keeps the
// program (run after the backward pass, as the CPU trainer does).
Status CudaTrainer::planOverlappedSync(const NcclGroups *groups) {
  const plan::Program *sync = nullptr;
  for (const plan::Program &p : programs_.programs())
    if (p.kind() == plan::Program::GRAD_SYNC) {
      if (sync) return Status::ok();  // several: keep the programs
      sync = &p;
    }
  // With pipeline stages the buckets (the tied embedding's among them) gather gradients of
  // several backward programs: the program runs after the schedule instead.
  if (!sync || !groups || plan_.p() > 1) return Status::ok();
  std::map<int, std::string> stashOf, gradientOf;
  for (const plan::Binding &a : sync->arguments())
    if (a.role() == plan::Binding::STASH) stashOf[a.buffer()] = a.name();
  for (const plan::Binding &r : sync->results())
    if (r.role() == plan::Binding::GRADIENT) gradientOf[r.buffer()] = r.name();
  std::vector<Bucket> buckets;
  for (const plan::Instruction &in : sync->instructions()) {
    // Only data-parallel buckets: another group's communicator (tp with sequence parallelism)
    // is in use on its own stream during the backward pass.
    if (in.op() != "all_reduce" || in.inputs_size() != in.outputs_size() || planattr::str(in, "group") != "dp")
      return Status::ok();
    Bucket b{nullptr, reduceOpOf(planattr::str(in, "reduce")), {}, 0};
    LOOM_RETURN_IF_ERROR(groups->find(planattr::str(in, "group"), &b.comm));
    for (int k = 0; k < in.inputs_size(); ++k) {
      auto s = stashOf.find(in.inputs(k));
      auto g = gradientOf.find(in.outputs(k));
      if (s == stashOf.end() || g == gradientOf.end() || !paramIndex_.count(g->second)) return Status::ok();
      b.members.emplace_back(s->second, paramIndex_.at(g->second));
    }
    buckets.push_back(std::move(b));
  }
  buckets_ = std::move(buckets);
  for (size_t i = 0; i < buckets_.size(); ++i)
    for (auto &[stash, param] : buckets_[i].members) {
      cudaEvent_t ready;
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "event"));
      bucketOf_[stash] = {i, ready};
    }
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamCreateWithFlags(&syncStream_, cudaStreamNonBlocking), "sync stream"));
  return cudaStatus(cudaEventCreateWithFlags(&syncDone_, cudaEventDisableTiming), "event");
}

// A member of a bucket is summed over the micro-batches (its accumulation just queued on
// `producer`); the bucket's all-reduce goes out on the sync stream once every member is.
Status CudaTrainer::memberReady(const std::string &stashName, cudaStream_t producer) {
  auto where = bucketOf_.find(stashName);
  if (where == bucketOf_.end()) return Status::ok();
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(where->second.second, producer), "event"));
  Bucket &b = buckets_[where->second.first];
  if (--b.pending > 0) return Status::ok();
  std::vector<NcclGroup::Part> parts;
  for (auto &[stash, param] : b.members) {
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(syncStream_, bucketOf_.at(stash).second, 0), "stream wait"));
    Param &p = params_[param];
    parts.push_back({backwardOut_.at({stash, -1}).f(), p.grad.f(), p.count});
    gradientSeen_[p.name] = true;
  }
  return b.comm->allReduce(parts, b.op, syncStream_);
}

// The micro-batch's inputs, once per schedule run, through pinned staging (an upload from
// pageable memory may stall the host on the stream).
Status CudaTrainer::uploadBatch(int mb, int64_t dataStep) {
  if (!uploaded_.insert(mb).second) return Status::ok();
  std::map<std::string, HostTensor> batch =
      makeBatch(*data_, firstSampleOf(plan_, dataStep, mb), plan_.micro_batch_size(), plan_.seq_length());
  for (auto &[name, t] : batch) {
    auto stage = staging_.find({name, mb});
    auto device = inputs_.find({name, mb});
    if (stage == staging_.end() || device == inputs_.end()) continue;  // no program of the step reads it
    const void *host = t.isInt ? static_cast<const void *>(t.ints.data()) : static_cast<const void *>(t.data.data());
    size_t bytes = size_t(t.numel()) * 4;
    if (bytes != stage->second.bytes || bytes != device->second.bytes)
      return Status::error("input " + name + " has " + std::to_string(bytes) + " bytes, the plan " +
                           std::to_string(device->second.bytes));
    std::memcpy(stage->second.data, host, bytes);  // its last upload finished: steps end synchronized
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(device->second.data, stage->second.data, bytes,
                                                    cudaMemcpyHostToDevice, executor_->computeStream()),
                                    "uploading " + name));
  }
  return Status::ok();
}

Status CudaTrainer::runProgram(const plan::Program &prog, int mb, int64_t dataStep, bool overlapSync) {
  bool forward = prog.kind() == plan::Program::FORWARD, sync = prog.kind() == plan::Program::GRAD_SYNC;
  if (forward) LOOM_RETURN_IF_ERROR(uploadBatch(mb, dataStep));
  std::vector<const void *> args;
  for (const plan::Binding &a : prog.arguments()) {
    const void *address = nullptr;
    if (a.role() == plan::Binding::PARAMETER) {
      auto it = paramIndex_.find(a.name());
      if (it != paramIndex_.end()) address = params_[it->second].value.data;
    } else if (a.role() == plan::Binding::INPUT) {
      auto it = inputs_.find({a.name(), mb});
      if (it != inputs_.end()) address = it->second.data;
    } else if (a.role() == plan::Binding::STASH) {
      auto &from = sync ? backwardOut_ : stash_;
      auto it = from.find({a.name(), sync ? -1 : mb});
      if (it != from.end()) address = it->second.data;
    }
    if (!address) return unboundArgument(prog, a.name(), mb);
    args.push_back(address);
  }
  ExecutionContext ctx;
  ctx.collectives = collectives_;
  ctx.seed = dropoutSeed(opt_.seed, dataStep, plan_.dp_rank(), mb);
  ctx.lossScale = opt_.precision == Precision::kFp16 ? float(scaler_.scale()) : 1.0f;
  ctx.training = !evaluating_;
  auto consume = [&](int i, const float *data, int64_t n, cudaStream_t s) -> Status {
    const plan::Binding &r = prog.results(i);
    size_t bytes = size_t(n) * sizeof(float);
    auto add = [&](float *into) { addBroadcast(into, data, into, n, n, s); };
    switch (r.role()) {
      case plan::Binding::STASH:
        if (forward) {
          Array *a;
          LOOM_RETURN_IF_ERROR(slot(stash_, r.name(), mb, bytes, false, &a));
          return cudaStatus(cudaMemcpyAsync(a->data, data, bytes, cudaMemcpyDeviceToDevice, s), "stashing");
        } else {
          Array *a;
          LOOM_RETURN_IF_ERROR(slot(backwardOut_, r.name(), -1, bytes, true, &a));
          add(a->f());
          if (overlapSync) return memberReady(r.name(), s);
        }
        return Status::ok();
      case plan::Binding::GRADIENT: {
        auto it = paramIndex_.find(r.name());
        if (it == paramIndex_.end()) return Status::error(prog.name() + ": a gradient of unknown parameter " + r.name());
        Param &p = params_[it->second];
        if (p.count != n) return Status::error(prog.name() + ": gradient " + r.name() + " has the wrong size");
        gradientSeen_[r.name()] = true;
        if (sync) return cudaStatus(cudaMemcpyAsync(p.grad.data, data, bytes, cudaMemcpyDeviceToDevice, s), "gradient");
        add(p.grad.f());
        return Status::ok();
      }
      case plan::Binding::LOSS:
        if (mb < 0 || mb >= plan_.micro_batches()) return Status::error(prog.name() + ": a loss outside the micro-batches");
        return cudaStatus(cudaMemcpyAsync(lossHost_ + mb, data, sizeof(float), cudaMemcpyDeviceToHost, s), "loss");
      default:
        return Status::ok();
    }
  };
  return executor_->runOnDevice(prog, args, consume, ctx);
}

Status CudaTrainer::unscaleAndCheck(bool *foundNonFinite) {
  cudaStream_t s = executor_->computeStream();
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(nonFinite_, 0, sizeof(int32_t), s), "flag"));
  for (Param &p : params_) unscaleGradients(p.grad.f(), p.count, float(scaler_.unscaleFactor()), nonFinite_, s);
  int32_t flag = 0;
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(&flag, nonFinite_, sizeof(flag), cudaMemcpyDeviceToHost, s), "flag"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(s), "overflow check"));
  float any = float(flag);  // a skip must be unanimous: over tp, then dp
  for (const char *group : {"tp", "dp", "pp"}) LOOM_RETURN_IF_ERROR(collectives_->allReduce(group, &any, 1, ReduceOp::kMax));
  *foundNonFinite = any > 0;
  return Status::ok();
}

// Each parameter counted once across tp replicas and tied copies, as Trainer::gradientNorm.
Status CudaTrainer::gradientNorm(double *norm) {
  cudaStream_t s = executor_->computeStream();
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(squares_, 0, sizeof(double), s), "norm"));
  for (Param &p : params_)
    if (p.counted) accumulateSquares(p.grad.f(), p.count, squares_, s);
  double local = 0;
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(&local, squares_, sizeof(local), cudaMemcpyDeviceToHost, s), "norm"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(s), "norm"));
  float sum = float(local);
  LOOM_RETURN_IF_ERROR(collectives_->allReduce("tp", &sum, 1, ReduceOp::kSum));
  LOOM_RETURN_IF_ERROR(collectives_->allReduce("pp", &sum, 1, ReduceOp::kSum));
  *norm = std::sqrt(double(sum));
  return Status::ok();
}

Status CudaTrainer::runSchedule(int64_t dataStep, bool forwardOnly, double *meanLoss) {
  cudaStream_t s = executor_->computeStream();
  bool overlap = !forwardOnly && !buckets_.empty();
  if (opt_.links) opt_.links->startStep();
  uploaded_.clear();
  int lastBackward = -1;
  for (int i = 0; i < plan_.schedule_size(); ++i) {
    auto it = byName_.find(plan_.schedule(i).program());
    if (it == byName_.end())
      return Status::error("the schedule names program '" + plan_.schedule(i).program() + "', which the plan lacks");
    if (it->second->kind() == plan::Program::BACKWARD) lastBackward = i;
  }
  if (overlap) {
    for (Bucket &b : buckets_) b.pending = int(b.members.size());
    // The sync stream starts after this step's zeroing (and the last step's optimizer).
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(syncDone_, s), "event"));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(syncStream_, syncDone_, 0), "stream wait"));
  }
  for (int i = 0; i < plan_.schedule_size(); ++i) {
    const plan::ScheduleEntry &e = plan_.schedule(i);
    const plan::Program *prog = byName_.at(e.program());
    if (forwardOnly && prog->kind() != plan::Program::FORWARD) continue;
    if (overlap && prog->kind() == plan::Program::GRAD_SYNC) continue;  // its buckets went out already
    LOOM_RETURN_IF_ERROR(runProgram(*prog, e.micro_batch(), dataStep, overlap && i == lastBackward));
  }
  if (overlap) {
    for (const Bucket &b : buckets_)
      if (b.pending != 0)
        return Status::error("a gradient bucket was never complete in the last backward pass (" +
                             b.members.front().first + " ...): the plan and the schedule disagree");
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(syncDone_, syncStream_), "event"));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(s, syncDone_, 0), "stream wait"));
  }
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(s), "the step's programs"));
  *meanLoss = 0;
  if (!isLossRank()) return Status::ok();  // the losses live on the last stage
  double lossSum = 0;
  for (int mb = 0; mb < plan_.micro_batches(); ++mb) lossSum += lossHost_[mb];
  float loss = float(lossSum / plan_.micro_batches());
  LOOM_RETURN_IF_ERROR(collectives_->allReduce("dp", &loss, 1, ReduceOp::kAvg));
  *meanLoss = loss;
  return Status::ok();
}

Status CudaTrainer::computeGradients(int64_t dataStep, StepResult *result) {
  auto started = std::chrono::steady_clock::now();
  cudaStream_t s = executor_->computeStream();
  *result = StepResult{};
  result->hasLoss = isLossRank();
  result->lossScale = opt_.precision == Precision::kFp16 ? scaler_.scale() : 0.0;
  for (Param &p : params_)
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(p.grad.data, 0, p.grad.bytes, s), "zeroing gradients"));
  for (auto &[key, a] : backwardOut_)
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(a.data, 0, a.bytes, s), "zeroing gradients"));
  gradientSeen_.clear();
  LOOM_RETURN_IF_ERROR(runSchedule(dataStep, /*forwardOnly=*/false, &result->loss));
  for (const Param &p : params_)
    if (!gradientSeen_.count(p.name)) return Status::error("no gradient was computed for parameter '" + p.name + "'");
  if (opt_.precision == Precision::kFp16) {
    bool overflow = false;
    LOOM_RETURN_IF_ERROR(unscaleAndCheck(&overflow));
    result->skipped = scaler_.update(overflow);
    if (result->skipped) ++skippedSteps_;
  }
  result->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return Status::ok();
}

Status CudaTrainer::evaluate(DataSource *data, int64_t batch, double *loss) {
  DataSource *train = data_;
  data_ = data, evaluating_ = true;
  Status s = runSchedule(batch, /*forwardOnly=*/true, loss);
  data_ = train, evaluating_ = false;
  return s;
}

Status CudaTrainer::scaleGradients(double factor) {
  for (Param &p : params_) scaleInPlace(p.grad.f(), p.count, float(factor), executor_->computeStream());
  return cudaStatus(cudaGetLastError(), "scaling gradients");
}

Status CudaTrainer::applyOptimizer(int64_t step, double lr) {
  cudaStream_t s = executor_->computeStream();
  for (Param &p : params_)
    adamwUpdate(p.value.f(), p.grad.f(), p.m.f(), p.v.f(), p.count, float(lr), float(opt_.adam.beta1),
                float(opt_.adam.beta2), float(opt_.adam.eps), float(opt_.adam.weightDecay), step, p.decay, s);
  executor_->parametersChanged();
  return cudaStatus(cudaStreamSynchronize(s), "the optimizer step");
}

Status CudaTrainer::step(int64_t step, double lr, double clip, StepResult *result, double *gradNorm) {
  auto started = std::chrono::steady_clock::now();
  *gradNorm = 0;
  LOOM_RETURN_IF_ERROR(computeGradients(step - 1, result));
  if (!result->skipped && plan_.zero1()) {
    LOOM_RETURN_IF_ERROR(distributedOptimizerStep(step - skippedSteps_, lr, clip, gradNorm));
  } else if (!result->skipped) {
    LOOM_RETURN_IF_ERROR(gradientNorm(gradNorm));
    if (!std::isfinite(*gradNorm))
      return Status::error("the gradient norm is not finite at iteration " + std::to_string(step) + ": stopping");
    if (clip > 0 && *gradNorm > clip) LOOM_RETURN_IF_ERROR(scaleGradients(clip / (*gradNorm + 1e-6)));
    // AdamW's bias correction counts the updates taken (as GradScaler and Megatron do).
    LOOM_RETURN_IF_ERROR(applyOptimizer(step - skippedSteps_, lr));
  }
  result->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return Status::ok();
}

Status CudaTrainer::planZero(const NcclGroups *groups) {
  if (!plan_.zero1()) return Status::ok();
  if (!groups) return Status::error("ZeRO-1 needs the data-parallel NCCL communicator");
  LOOM_RETURN_IF_ERROR(groups->find("dp", &dpComm_));
  int64_t d = plan_.d();
  for (const Param &p : params_) zero_.total += p.count;
  zero_.shard = (zero_.total + d - 1) / d, zero_.begin = plan_.dp_rank() * zero_.shard;
  // The masks of this rank's slice, as Trainer::distributedOptimizerStep builds them.
  std::vector<float> counted(size_t(zero_.shard * d), 0.0f), decayed(counted.size(), 0.0f);
  int64_t at = 0;
  for (const Param &p : params_) {
    std::fill_n(counted.begin() + at, p.count, p.counted ? 1.0f : 0.0f);
    std::fill_n(decayed.begin() + at, p.count, p.decay ? 1.0f : 0.0f);
    at += p.count;
  }
  size_t shardBytes = size_t(zero_.shard) * sizeof(float);
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&zero_.flat, shardBytes * size_t(d)), "ZeRO-1 flat buffer"));
  for (float **a : {&zero_.grad, &zero_.m, &zero_.v, &zero_.counted, &zero_.decayed})
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMalloc(a, shardBytes), "ZeRO-1 shard"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemset(zero_.m, 0, shardBytes), "ZeRO-1 state"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemset(zero_.v, 0, shardBytes), "ZeRO-1 state"));
  LOOM_RETURN_IF_ERROR(cudaStatus(
      cudaMemcpy(zero_.counted, counted.data() + zero_.begin, shardBytes, cudaMemcpyHostToDevice), "ZeRO-1 masks"));
  return cudaStatus(cudaMemcpy(zero_.decayed, decayed.data() + zero_.begin, shardBytes, cudaMemcpyHostToDevice),
                    "ZeRO-1 masks");
}

Status CudaTrainer::flatten(Array Param::*which) {
  cudaStream_t s = executor_->computeStream();
  int64_t at = 0;
  for (const Param &p : params_) {
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(zero_.flat + at, (p.*which).data, size_t(p.count) * sizeof(float),
                                                    cudaMemcpyDeviceToDevice, s),
                                    "flattening"));
    at += p.count;
  }
  size_t padding = size_t(zero_.shard * plan_.d() - at) * sizeof(float);
  return cudaStatus(cudaMemsetAsync(zero_.flat + at, 0, padding, s), "flattening");
}

Status CudaTrainer::unflattenParameters() {
  cudaStream_t s = executor_->computeStream();
  int64_t at = 0;
  for (Param &p : params_) {
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(p.value.data, zero_.flat + at, size_t(p.count) * sizeof(float),
                                                    cudaMemcpyDeviceToDevice, s),
                                    "unflattening"));
    at += p.count;
  }
  return Status::ok();
}

Status CudaTrainer::distributedOptimizerStep(int64_t step, double lr, double clip, double *norm) {
  if (!plan_.zero1()) return Status::error("distributedOptimizerStep on a plan without zero1");
  cudaStream_t s = executor_->computeStream();
  LOOM_RETURN_IF_ERROR(flatten(&Param::grad));
  LOOM_RETURN_IF_ERROR(dpComm_->reduceScatterSum(zero_.flat, zero_.grad, zero_.shard, s));
  scaleInPlace(zero_.grad, zero_.shard, 1.0f / float(plan_.d()), s);
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(squares_, 0, sizeof(double), s), "norm"));
  accumulateSquares(zero_.grad, zero_.shard, squares_, s, zero_.counted);
  double local = 0;
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(&local, squares_, sizeof(local), cudaMemcpyDeviceToHost, s), "norm"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(s), "norm"));
  float sum = float(local);
  for (const char *group : {"dp", "tp", "pp"}) LOOM_RETURN_IF_ERROR(collectives_->allReduce(group, &sum, 1, ReduceOp::kSum));
  *norm = std::sqrt(double(sum));
  if (clip > 0 && *norm > clip) scaleInPlace(zero_.grad, zero_.shard, float(clip / (*norm + 1e-6)), s);
  LOOM_RETURN_IF_ERROR(flatten(&Param::value));
  float *mine = zero_.flat + zero_.begin;
  adamwUpdateMasked(mine, zero_.grad, zero_.m, zero_.v, zero_.decayed, zero_.shard, float(lr), float(opt_.adam.beta1),
                    float(opt_.adam.beta2), float(opt_.adam.eps), float(opt_.adam.weightDecay), step, s);
  LOOM_RETURN_IF_ERROR(dpComm_->allGather(mine, zero_.flat, zero_.shard, s));  // in place: NCCL allows it
  LOOM_RETURN_IF_ERROR(unflattenParameters());
  executor_->parametersChanged();
  return cudaStatus(cudaStreamSynchronize(s), "the ZeRO-1 step");
}

Status CudaTrainer::synchronizeGradientsOverDataParallel() {
  if (!dpComm_) return Status::ok();  // without ZeRO-1 the grad-sync program did it
  cudaStream_t s = executor_->computeStream();
  for (Param &p : params_) LOOM_RETURN_IF_ERROR(dpComm_->allReduce({{p.grad.f(), p.grad.f(), p.count}}, ReduceOp::kAvg, s));
  return cudaStatus(cudaStreamSynchronize(s), "averaging gradients");
}

Status CudaTrainer::downloadZeroState(AdamWState *out) {
  if (!plan_.zero1()) return Status::ok();
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(executor_->computeStream()), "synchronize"));
  LOOM_RETURN_IF_ERROR(download(zero_.m, size_t(zero_.shard), &out->m));
  return download(zero_.v, size_t(zero_.shard), &out->v);
}

Status CudaTrainer::uploadZeroState(const AdamWState &state) {
  if (!plan_.zero1()) return Status::ok();
  size_t bytes = size_t(zero_.shard) * sizeof(float);
  if (state.m.size() != size_t(zero_.shard) || state.v.size() != size_t(zero_.shard))
    return Status::error("the ZeRO-1 optimizer state has " + std::to_string(state.m.size()) + " elements, expected " +
                         std::to_string(zero_.shard));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpy(zero_.m, state.m.data(), bytes, cudaMemcpyHostToDevice), "upload"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpy(zero_.v, state.v.data(), bytes, cudaMemcpyHostToDevice), "upload"));
  return cudaStatus(cudaDeviceSynchronize(), "upload of the ZeRO-1 state");
}

CudaTrainer::LossScaling CudaTrainer::lossScaling() const {
  return {scaler_.scale(), scaler_.cleanSteps()};
}

void CudaTrainer::restoreLossScaling(const LossScaling &state) { scaler_.restore(state.scale, state.cleanSteps); }

Status CudaTrainer::download(const float *device, size_t count, std::vector<float> *host) {
  host->resize(count);
  return cudaStatus(cudaMemcpy(host->data(), device, count * sizeof(float), cudaMemcpyDeviceToHost), "download");
}

Status CudaTrainer::downloadTensors(Array Param::*which, std::map<std::string, HostTensor> *out) {
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(executor_->computeStream()), "synchronize"));
  for (const Param &p : params_) {
    HostTensor &t = (*out)[p.name];
    t.shape = p.shape, t.isInt = false;
    LOOM_RETURN_IF_ERROR(download((p.*which).f(), size_t(p.count), &t.data));
  }
  return Status::ok();
}

Status CudaTrainer::downloadParameters(std::map<std::string, HostTensor> *out) {
  return downloadTensors(&Param::value, out);
}

Status CudaTrainer::downloadGradients(std::map<std::string, HostTensor> *out) {
  return downloadTensors(&Param::grad, out);
}

Status CudaTrainer::downloadAdam(std::map<std::string, AdamWState> *out) {
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(executor_->computeStream()), "synchronize"));
  for (const Param &p : params_) {
    AdamWState &st = (*out)[p.name];
    LOOM_RETURN_IF_ERROR(download(p.m.f(), size_t(p.count), &st.m));
    LOOM_RETURN_IF_ERROR(download(p.v.f(), size_t(p.count), &st.v));
  }
  return Status::ok();
}

Status CudaTrainer::uploadState(const std::map<std::string, HostTensor> &params,
                                const std::map<std::string, AdamWState> &adam) {
  cudaStream_t s = executor_->computeStream();
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(s), "synchronize"));
  for (Param &p : params_) {
    auto it = params.find(p.name);
    if (it == params.end() || it->second.data.size() != size_t(p.count))
      return Status::error("no value of " + std::to_string(p.count) + " elements for parameter " + p.name);
    size_t bytes = size_t(p.count) * sizeof(float);
    LOOM_RETURN_IF_ERROR(
        cudaStatus(cudaMemcpy(p.value.data, it->second.data.data(), bytes, cudaMemcpyHostToDevice), "upload"));
    auto st = adam.find(p.name);
    bool moments = st != adam.end() && st->second.m.size() == size_t(p.count) && st->second.v.size() == size_t(p.count);
    for (auto [array, host] : {std::pair{&p.m, moments ? &st->second.m : nullptr},
                               std::pair{&p.v, moments ? &st->second.v : nullptr}}) {
      cudaError_t err = host ? cudaMemcpy(array->data, host->data(), bytes, cudaMemcpyHostToDevice)
                             : cudaMemset(array->data, 0, bytes);
      LOOM_RETURN_IF_ERROR(cudaStatus(err, "upload of the AdamW state"));
    }
  }
  executor_->parametersChanged();
  // As in create: the copies ran on the legacy stream; drain before the executor's streams run.
  return cudaStatus(cudaDeviceSynchronize(), "upload of the training state");
}

}  // namespace loom::cuda
