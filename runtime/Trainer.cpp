#include "runtime/Trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>

#include "runtime/Executor.h"
#include "runtime/ParamInit.h"
#include "runtime/Safetensors.h"
#include "runtime/Shards.h"

namespace loom {
namespace {

// Adds n floats into into[key] (created with `shape` on first use; kept across steps, so
// accumulation touches no fresh pages).
void accumulate(std::map<std::string, HostTensor> &into, const std::string &key, const float *data, int64_t n,
                const google::protobuf::RepeatedField<int64_t> &shape, bool overwrite) {
  auto [it, fresh] = into.try_emplace(key);
  if (fresh || int64_t(it->second.data.size()) != n) {
    it->second.shape.assign(shape.begin(), shape.end());
    it->second.data.assign(data, data + n);
    return;
  }
  float *dst = it->second.data.data();
  if (overwrite)
    std::copy_n(data, n, dst);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] += data[i];
}

void zero(std::map<std::string, HostTensor> &tensors) {
  for (auto &[k, t] : tensors) std::fill(t.data.begin(), t.data.end(), 0.0f);
}


}  // namespace

uint64_t dropoutSeed(uint64_t seed, int64_t step, int dp, int mb) {
  uint64_t z = seed ^ (uint64_t(step) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(dp) << 40) ^ (uint64_t(mb) << 20);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Status unboundArgument(const plan::Program &prog, const std::string &name, int mb) {
  return Status::error(prog.name() + ": nothing to bind to argument '" + name + "' (micro-batch " +
                       std::to_string(mb) + "): the plan and the schedule disagree");
}

int64_t firstSampleOf(const plan::RankPlan &plan, int64_t step, int mb) {
  return ((step * plan.d() + plan.dp_rank()) * plan.micro_batches() + mb) * plan.micro_batch_size();
}

Trainer::Trainer(plan::RankPlan plan, plan::ProgramSet programs, Collectives *collectives, DataSource *data,
                 TrainerOptions options)
    : plan_(std::move(plan)), programs_(std::move(programs)), collectives_(collectives), data_(data),
      opt_(options), trainData_(data) {
  for (const plan::Program &p : programs_.programs()) byName_[p.name()] = &p;
  std::vector<HostTensor> initial = initParameters(plan_, opt_.seed);
  for (int i = 0; i < plan_.parameters_size(); ++i) params_[plan_.parameters(i).name()] = std::move(initial[size_t(i)]);
}

Status Trainer::runProgram(const plan::Program &prog, int mb, int64_t step, double *loss) {
  std::vector<const HostTensor *> args;
  for (const plan::Binding &a : prog.arguments()) {
    const HostTensor *t = nullptr;
    switch (a.role()) {
      case plan::Binding::PARAMETER: {
        auto it = params_.find(a.name());
        if (it != params_.end()) t = &it->second;
        break;
      }
      case plan::Binding::INPUT: {
        if (!batches_.count(mb)) {
          batches_[mb] = makeBatch(*data_, firstSampleOf(plan_, step, mb), plan_.micro_batch_size(), plan_.seq_length());
          if (!opt_.dumpBatches.empty() && data_ == trainData_ && plan_.tp_rank() == 0 && plan_.pp_rank() == 0) {
            SafetensorsFile f;
            f.tensors = batches_[mb];
            char name[96];
            std::snprintf(name, sizeof name, "/batch_step%05lld_dp%03d_mb%04d.safetensors", (long long)step,
                          plan_.dp_rank(), mb);
            LOOM_RETURN_IF_ERROR(writeSafetensors(opt_.dumpBatches + name, f));
          }
        }
        auto it = batches_[mb].find(a.name());
        if (it != batches_[mb].end()) t = &it->second;
        break;
      }
      case plan::Binding::STASH: {
        if (prog.kind() == plan::Program::GRAD_SYNC) {
          auto it = backwardOut_.find(a.name());
          if (it != backwardOut_.end()) t = &it->second;
        } else {
          auto it = stash_.find({a.name(), mb});
          if (it != stash_.end()) t = &it->second;
        }
        break;
      }
      default:
        break;
    }
    if (!t) return unboundArgument(prog, a.name(), mb);
    args.push_back(t);
  }
  ExecutionContext ctx;
  ctx.collectives = collectives_;
  ctx.seed = dropoutSeed(opt_.seed, step, plan_.dp_rank(), mb);
  ctx.messageTag = mb < 0 ? 0 : mb * kTagsPerMicroBatch;
  ctx.workspace = &workspaces_[&prog];
  ctx.training = !evaluating_;
  if (!evaluating_) ctx.trace = opt_.trace, ctx.traceMicroBatch = mb;  // the training step only
  auto consume = [&](int i, const float *data, int64_t n) {
    const plan::Binding &r = prog.results(i);
    const auto &shape = prog.buffers(r.buffer()).shape();
    switch (r.role()) {
      case plan::Binding::STASH:
        if (prog.kind() == plan::Program::FORWARD) {
          HostTensor &t = stash_[{r.name(), mb}];
          t.shape.assign(shape.begin(), shape.end());
          t.data.assign(data, data + n);
        } else {
          accumulate(backwardOut_, r.name(), data, n, shape, /*overwrite=*/false);
        }
        break;
      case plan::Binding::GRADIENT:
        accumulate(grads_, r.name(), data, n, shape, /*overwrite=*/prog.kind() == plan::Program::GRAD_SYNC);
        break;
      case plan::Binding::LOSS:
        *loss += data[0];
        break;
      default:
        break;
    }
  };
  LOOM_RETURN_IF_ERROR(executeProgram(prog, args, consume, ctx));
  // A backward program consumes its micro-batch's stash.
  if (prog.kind() == plan::Program::BACKWARD)
    for (const plan::Binding &a : prog.arguments())
      if (a.role() == plan::Binding::STASH) stash_.erase({a.name(), mb});
  return Status::ok();
}

Status Trainer::runSchedule(int64_t step, bool forwardOnly, double *lossSum) {
  zero(grads_);
  zero(backwardOut_);
  stash_.clear();
  batches_.clear();
  for (const plan::ScheduleEntry &e : plan_.schedule()) {
    auto it = byName_.find(e.program());
    if (it == byName_.end()) return Status::error("the schedule names program '" + e.program() + "', which the plan lacks");
    if (forwardOnly && it->second->kind() != plan::Program::FORWARD) continue;
    LOOM_RETURN_IF_ERROR(runProgram(*it->second, e.micro_batch(), step, lossSum));
  }
  stash_.clear();
  return collectives_->flush();
}

Status Trainer::evaluate(DataSource *data, int64_t batch, double *loss) {
  DataSource *train = data_;
  data_ = data;
  double lossSum = 0;
  evaluating_ = true;
  Status s = runSchedule(batch, /*forwardOnly=*/true, &lossSum);
  evaluating_ = false;
  data_ = train;
  LOOM_RETURN_IF_ERROR(s);
  if (isLossRank()) {
    float l = float(lossSum / plan_.micro_batches());
    LOOM_RETURN_IF_ERROR(collectives_->allReduce("dp", &l, 1, ReduceOp::kAvg));
    *loss = l;
  }
  return Status::ok();
}

Status Trainer::computeGradients(int64_t step, StepResult *result) {
  auto started = std::chrono::steady_clock::now();
  double lossSum = 0;
  LOOM_RETURN_IF_ERROR(runSchedule(step, /*forwardOnly=*/false, &lossSum));
  result->hasLoss = isLossRank();
  if (result->hasLoss) {
    float loss = float(lossSum / plan_.micro_batches());
    LOOM_RETURN_IF_ERROR(collectives_->allReduce("dp", &loss, 1, ReduceOp::kAvg));
    result->loss = loss;
  }
  for (const plan::Parameter &p : plan_.parameters())
    if (!grads_.count(p.name())) return Status::error("no gradient was computed for parameter '" + p.name() + "'");
  result->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return Status::ok();
}

Status Trainer::gradientNorm(double *norm) {
  double local = 0;
  for (const plan::Parameter &p : plan_.parameters()) {
    if (!p.tied_to().empty()) continue;                    // the copy's twin is counted
    if (p.shard_dim() < 0 && plan_.tp_rank() != 0) continue;  // replicated across tp
    for (float g : grads_.at(p.name()).data) local += double(g) * g;
  }
  float sum = float(local);
  LOOM_RETURN_IF_ERROR(collectives_->allReduce("tp", &sum, 1, ReduceOp::kSum));
  LOOM_RETURN_IF_ERROR(collectives_->allReduce("pp", &sum, 1, ReduceOp::kSum));
  *norm = std::sqrt(double(sum));
  return Status::ok();
}

Status Trainer::scaleGradients(double factor) {
  for (auto &[name, g] : grads_)
    for (float &v : g.data) v = float(v * factor);
  return Status::ok();
}

Status Trainer::saveShard(const std::string &path, const std::map<std::string, std::string> &metadata) {
  SafetensorsFile f;
  f.metadata = metadata;
  if (plan_.zero1()) {  // this rank's shard of the flat AdamW state
    HostTensor m{{int64_t(zeroState_.m.size())}}, v{{int64_t(zeroState_.v.size())}};
    m.data = zeroState_.m, v.data = zeroState_.v;
    f.tensors["zero1/adam_m"] = std::move(m);
    f.tensors["zero1/adam_v"] = std::move(v);
  }
  for (auto &[name, p] : params_) {
    f.tensors["param/" + name] = p;
    if (plan_.zero1()) continue;  // the moments live in the flat ZeRO-1 shard above
    auto it = adam_.find(name);
    HostTensor m{p.shape}, v{p.shape};
    m.data = it != adam_.end() && !it->second.m.empty() ? it->second.m : std::vector<float>(p.data.size(), 0.0f);
    v.data = it != adam_.end() && !it->second.v.empty() ? it->second.v : std::vector<float>(p.data.size(), 0.0f);
    f.tensors["adam_m/" + name] = std::move(m);
    f.tensors["adam_v/" + name] = std::move(v);
  }
  return writeSafetensors(path, f);
}

Status Trainer::loadShard(const std::string &path, std::map<std::string, std::string> *metadata) {
  SafetensorsFile f;
  LOOM_RETURN_IF_ERROR(readSafetensors(path, &f));
  if (plan_.zero1()) {
    if (!f.tensors.count("zero1/adam_m") || !f.tensors.count("zero1/adam_v"))
      return Status::error(path + ": no ZeRO-1 optimizer state (a checkpoint of another layout)");
    zeroState_.m = f.tensors["zero1/adam_m"].data;
    zeroState_.v = f.tensors["zero1/adam_v"].data;
    int64_t total = 0;
    for (auto &[name, p] : params_) total += int64_t(p.data.size());
    size_t shard = size_t((total + plan_.d() - 1) / plan_.d());
    if (zeroState_.m.size() != shard || zeroState_.v.size() != shard)
      return Status::error(path + ": the ZeRO-1 optimizer state has " + std::to_string(zeroState_.m.size()) +
                           " elements, expected " + std::to_string(shard));
  }
  for (auto &[name, p] : params_) {
    for (const char *kind : {"param/", "adam_m/", "adam_v/"}) {
      if (plan_.zero1() && std::string(kind) != "param/") continue;
      if (!f.tensors.count(kind + name) || f.tensors[kind + name].data.size() != p.data.size())
        return Status::error(path + ": no " + kind + name + " of " + std::to_string(p.data.size()) +
                             " elements (a checkpoint of another model or layout)");
    }
    p.data = f.tensors["param/" + name].data;
    if (plan_.zero1()) continue;
    adam_[name].m = f.tensors["adam_m/" + name].data;
    adam_[name].v = f.tensors["adam_v/" + name].data;
  }
  *metadata = f.metadata;
  return Status::ok();
}

Status Trainer::loadGlobalParameters(const std::map<std::string, HostTensor> &global) {
  for (const plan::Parameter &p : plan_.parameters()) {
    const std::string &source = p.tied_to().empty() ? p.name() : p.tied_to();
    auto it = global.find(source);
    if (it == global.end()) return Status::error("the weights file has no tensor for parameter '" + source + "'");
    const HostTensor &full = it->second;
    if (full.isInt || int64_t(full.data.size()) != full.numel())
      return Status::error("'" + source + "' in the weights file is not an fp32 tensor");
    if (int(full.shape.size()) != p.global_shape_size())
      return Status::error("'" + source + "' has rank " + std::to_string(full.shape.size()) + " in the weights file");
    for (int k = 0; k < p.global_shape_size(); ++k)
      if (full.shape[k] != p.global_shape(k))
        return Status::error("'" + source + "' dim " + std::to_string(k) + " is " + std::to_string(full.shape[k]) +
                             " in the weights file, expected " + std::to_string(p.global_shape(k)));
    HostTensor &local = params_.at(p.name());
    int dim = p.shard_dim();
    if (dim < 0) {
      local.data = full.data;
      continue;
    }
    copyShardOut(full.data, local.data, shardGeometry(local.shape, dim), p.shard_parts(), p.shard_index());
  }
  adam_.clear();
  return Status::ok();
}

Status Trainer::synchronizeGradientsOverDataParallel() {
  for (const plan::Parameter &p : plan_.parameters()) {
    HostTensor &g = grads_.at(p.name());
    LOOM_RETURN_IF_ERROR(collectives_->allReduce("dp", g.data.data(), int64_t(g.data.size()), ReduceOp::kAvg));
  }
  return Status::ok();
}

Status Trainer::distributedOptimizerStep(int64_t step, double lr, double clip, double *norm) {
  int d = plan_.d(), dp = plan_.dp_rank();
  int64_t total = 0;
  for (const plan::Parameter &p : plan_.parameters()) total += int64_t(params_.at(p.name()).data.size());
  int64_t shard = (total + d - 1) / d, begin = int64_t(dp) * shard;
  // Flat gradients, and per element: counted in the norm? decayed?
  std::vector<float> flat(shard * d, 0.0f), counted(shard * d, 0.0f), decayed(shard * d, 0.0f);
  int64_t at = 0;
  for (const plan::Parameter &p : plan_.parameters()) {
    const HostTensor &g = grads_.at(p.name());
    bool count = p.tied_to().empty() && !(p.shard_dim() < 0 && plan_.tp_rank() != 0);
    bool decay = decays(p.name(), {p.shape().begin(), p.shape().end()});
    std::copy(g.data.begin(), g.data.end(), flat.begin() + at);
    std::fill_n(counted.begin() + at, g.data.size(), count ? 1.0f : 0.0f);
    std::fill_n(decayed.begin() + at, g.data.size(), decay ? 1.0f : 0.0f);
    at += int64_t(g.data.size());
  }
  HostTensor gradShard{{shard}};
  gradShard.data.assign(shard, 0.0f);
  LOOM_RETURN_IF_ERROR(collectives_->reduceScatter("dp", flat.data(), gradShard.data.data(), shard));
  for (float &v : gradShard.data) v /= float(d);
  double local = 0;
  for (int64_t i = 0; i < shard; ++i) local += counted[begin + i] * double(gradShard.data[i]) * gradShard.data[i];
  float sum = float(local);
  for (const char *group : {"dp", "tp", "pp"}) LOOM_RETURN_IF_ERROR(collectives_->allReduce(group, &sum, 1, ReduceOp::kSum));
  *norm = std::sqrt(double(sum));
  if (clip > 0 && *norm > clip)
    for (float &v : gradShard.data) v = float(v * (clip / (*norm + 1e-6)));
  // This rank's slice of the flat parameters, updated elementwise (decay per element).
  std::vector<float> flatParams(shard * d, 0.0f);
  at = 0;
  for (const plan::Parameter &p : plan_.parameters()) {
    const HostTensor &w = params_.at(p.name());
    std::copy(w.data.begin(), w.data.end(), flatParams.begin() + at);
    at += int64_t(w.data.size());
  }
  HostTensor paramShard{{shard}};
  paramShard.data.assign(flatParams.begin() + begin, flatParams.begin() + begin + shard);
  // AdamW (as adamwUpdate), with weight decay per element: only where the parameter decays.
  if (zeroState_.m.size() != size_t(shard)) zeroState_.m.assign(shard, 0.0f), zeroState_.v.assign(shard, 0.0f);
  double c1 = 1 - std::pow(opt_.adam.beta1, double(step)), c2 = 1 - std::pow(opt_.adam.beta2, double(step));
  for (int64_t i = 0; i < shard; ++i) {
    float g = gradShard.data[i];
    zeroState_.m[i] = float(opt_.adam.beta1 * zeroState_.m[i] + (1 - opt_.adam.beta1) * g);
    zeroState_.v[i] = float(opt_.adam.beta2 * zeroState_.v[i] + (1 - opt_.adam.beta2) * double(g) * g);
    double update = (zeroState_.m[i] / c1) / (std::sqrt(zeroState_.v[i] / c2) + opt_.adam.eps);
    if (decayed[begin + i] != 0) update += opt_.adam.weightDecay * paramShard.data[i];
    paramShard.data[i] = float(paramShard.data[i] - lr * update);
  }
  LOOM_RETURN_IF_ERROR(collectives_->allGather("dp", paramShard.data.data(), flatParams.data(), shard));
  at = 0;
  for (const plan::Parameter &p : plan_.parameters()) {
    HostTensor &w = params_.at(p.name());
    std::copy_n(flatParams.begin() + at, w.data.size(), w.data.begin());
    at += int64_t(w.data.size());
  }
  return Status::ok();
}

Status Trainer::applyOptimizer(int64_t step, double lr) {
  for (auto &[name, param] : params_)
    adamwUpdate(param, grads_.at(name), adam_[name], opt_.adam, lr, step, decays(name, param.shape));
  return Status::ok();
}

}  // namespace loom
