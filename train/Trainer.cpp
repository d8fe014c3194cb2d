#include "train/Trainer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "plan/PlanAttributes.h"
#include "train/ParamInit.h"
#include "formats/Safetensors.h"
#include "support/Checksum.h"
#include "support/ProgressMeter.h"
#include "runtime/Shards.h"

namespace loom {
namespace {

int64_t elementsOf(const plan::Parameter &p) {
  int64_t n = 1;
  for (int64_t d : p.shape()) n *= d;
  return n;
}

// The flat buffer's layout (every parameter's offset and size): ZeRO-1's optimizer shard is raw
// flat memory, valid only for the layout it was written with.
std::string flatLayoutOf(const plan::RankPlan &plan) {
  std::string text = std::to_string(plan.flat_elements());
  for (const plan::Parameter &p : plan.parameters())
    text += ";" + p.name() + "@" + std::to_string(p.flat_offset()) + ":" + std::to_string(elementsOf(p));
  for (int i = 0; i < plan.zero1_buckets_size(); ++i)
    text += ";bucket:" + std::to_string(plan.zero1_buckets(i)) +
            (i < plan.zero1_bucket_groups_size() && plan.zero1_bucket_groups(i) != "dp" ? "@" + plan.zero1_bucket_groups(i) : "");
  return checksumHex(checksum64(text));
}

}  // namespace

Trainer::Trainer(plan::RankPlan plan, plan::ProgramSet programs, std::unique_ptr<StepBackend> backend,
                 Collectives *collectives, DataSource *data, const TrainerOptions &options)
    : plan_(std::move(plan)), programs_(std::move(programs)), backend_(std::move(backend)), data_(data),
      opt_(options), driver_(plan_, programs_, *backend_, collectives, options.seed), scaler_(options.lossScaler) {}

Status Trainer::create(plan::RankPlan plan, plan::ProgramSet programs, std::unique_ptr<StepBackend> backend,
                       Collectives *collectives, DataSource *data, const TrainerOptions &options,
                       std::unique_ptr<Trainer> *out) {
  // An fp16 plan (its programs compute with fp16 weights) trains with dynamic loss scaling,
  // as Megatron's --fp16 does; bf16's range needs none.
  TrainerOptions opt = options;
  if (planattr::computeDtype(programs.programs()) == plan::F16) opt.lossScaling = true;
  if (opt.lossScaling) LOOM_RETURN_IF_ERROR(LossScaler::validate(opt.lossScaler));
  for (const plan::Program &p : programs.programs())
    if (Status s = backend->checkKernels(p); !s.isOk())
      return Status::error(plan.programs_file() + ": " + s.message());
  std::unique_ptr<Trainer> t(
      new Trainer(std::move(plan), std::move(programs), std::move(backend), collectives, data, opt));
  LOOM_RETURN_IF_ERROR(t->driver_.init(initParameters(t->plan_, options.seed)));
  t->driver_.setTrace(options.trace);
  t->driver_.setProgress(options.progress);
  if (options.stallStep >= 0) t->driver_.stallForTest(options.stallStep, "linear");
  if (options.slowdown > 0) t->driver_.slowForTest(options.slowdown);
  t->driver_.setDumpBatches(options.dumpBatches);
  *out = std::move(t);
  return Status::ok();
}

Status Trainer::computeGradients(int64_t step, StepResult *result) {
  if (step < 0) return Status::error("data step " + std::to_string(step) + ": steps count from 0 (a caller bug)");
  float scale = opt_.lossScaling ? float(scaler_.scale()) : 1.0f;
  driver_.setLossScale(scale);
  result->lossScale = opt_.lossScaling ? scale : 0;
  return driver_.runGradients(data_, step, /*evaluate=*/false, &result->hasLoss, &result->loss);
}

Status Trainer::optimizerStep(int64_t update, double lr, double clip, double *norm, bool *skipped) {
  OptimizerScalars s;
  s.learningRate = lr, s.clipGrad = clip, s.adamStep = update;
  s.lossScale = opt_.lossScaling ? scaler_.scale() : 1.0;
  s.weightDecay = opt_.adam.weightDecay, s.beta1 = opt_.adam.beta1, s.beta2 = opt_.adam.beta2, s.eps = opt_.adam.eps;
  LOOM_RETURN_IF_ERROR(driver_.runOptimizer(s, norm));
  bool finite = std::isfinite(*norm);
  *skipped = false;
  if (opt_.lossScaling) {
    *skipped = scaler_.update(!finite);
    return Status::ok();
  }
  if (!finite)
    return Status::error("the gradient norm is " + std::to_string(*norm) +
                         ": the update was skipped and training stops (no checkpoint of this state is written)");
  return Status::ok();
}

Status Trainer::evaluate(DataSource *data, int64_t batch, double *loss) {
  bool hasLoss = false;
  *loss = 0;
  return driver_.runGradients(data, batch, /*evaluate=*/true, &hasLoss, loss);
}

Status Trainer::hostGradients(std::map<std::string, HostTensor> *out) {
  out->clear();
  LOOM_RETURN_IF_ERROR(driver_.gatherGradients());
  LOOM_RETURN_IF_ERROR(backend_->synchronize());
  for (const plan::Parameter &p : plan_.parameters()) {
    HostTensor &t = (*out)[p.name()];
    t.shape.assign(p.shape().begin(), p.shape().end());
    LOOM_RETURN_IF_ERROR(backend_->download(driver_.gradient(p.name()), &t.data));
  }
  return Status::ok();
}

Status Trainer::hostParameters(std::map<std::string, HostTensor> *out) {
  out->clear();
  LOOM_RETURN_IF_ERROR(driver_.gatherParameters());
  LOOM_RETURN_IF_ERROR(backend_->synchronize());
  for (const plan::Parameter &p : plan_.parameters()) {
    HostTensor &t = (*out)[p.name()];
    t.shape.assign(p.shape().begin(), p.shape().end());
    LOOM_RETURN_IF_ERROR(backend_->download(driver_.parameter(p.name()), &t.data));
  }
  return Status::ok();
}

// The shard: param/NAME for every parameter; AdamW's moments as adam_m/NAME and adam_v/NAME
// (slices of the flat state), or with ZeRO-1 this rank's flat shard as zero1/adam_m and
// zero1/adam_v; fp16's loss scale and clean-step run in the metadata.
namespace {
// A progress line over a shard's bytes, drawn when `show` (and on a terminal).
ByteProgress shardProgress(bool show, const char *what, std::unique_ptr<ProgressMeter> *meter) {
  if (!show) return {};
  return [=](int64_t done, int64_t total) {
    if (!*meter) meter->reset(new ProgressMeter(what, total, "", /*bytes=*/true));
    (*meter)->update(done);
    if (total > 0 && done >= total) (*meter)->finish();  // the file is done (the rest is memory work)
  };
}
}  // namespace

Status Trainer::saveShard(const std::string &path, const std::map<std::string, std::string> &metadata, bool progress) {
  SafetensorsFile f;
  f.metadata = metadata;
  f.metadata["flat_layout"] = flatLayoutOf(plan_);
  LOOM_RETURN_IF_ERROR(backend_->synchronize());
  std::map<std::string, HostTensor> params;
  LOOM_RETURN_IF_ERROR(hostParameters(&params));
  for (auto &[name, t] : params) f.tensors["param/" + name] = std::move(t);
  for (const char *moment : {"adam_m", "adam_v"}) {
    auto it = driver_.optimizerState().find(moment);
    if (it == driver_.optimizerState().end()) return Status::error("the plan's optimizer has no " + std::string(moment));
    if (plan_.zero1()) {
      HostTensor t{{it->second.count}};
      LOOM_RETURN_IF_ERROR(backend_->download(it->second, &t.data));
      f.tensors[std::string("zero1/") + moment] = std::move(t);
      continue;
    }
    for (const plan::Parameter &p : plan_.parameters()) {
      HostTensor t{{p.shape().begin(), p.shape().end()}};
      LOOM_RETURN_IF_ERROR(backend_->download(driver_.sliceOf(it->second, p.name()), &t.data));
      f.tensors[std::string(moment) + "/" + p.name()] = std::move(t);
    }
  }
  if (opt_.lossScaling) {
    char scale[40];
    std::snprintf(scale, sizeof scale, "%.17g", scaler_.scale());
    f.metadata["fp16_loss_scale"] = scale;
    f.metadata["fp16_clean_steps"] = std::to_string(scaler_.cleanSteps());
  }
  std::unique_ptr<ProgressMeter> meter;
  return writeSafetensors(path, f, shardProgress(progress, "saving the checkpoint (this rank's shard)", &meter));
}

Status Trainer::loadShard(const std::string &path, std::map<std::string, std::string> *metadata, bool progress) {
  SafetensorsFile f;
  std::unique_ptr<ProgressMeter> meter;
  LOOM_RETURN_IF_ERROR(readSafetensors(path, &f, shardProgress(progress, "loading the checkpoint (this rank's shard)", &meter)));
  auto take = [&](const std::string &key, ArgumentView into) -> Status {
    auto it = f.tensors.find(key);
    if (it == f.tensors.end() || it->second.isInt || int64_t(it->second.data.size()) != into.count)
      return Status::error(path + ": no " + key + " of " + std::to_string(into.count) +
                           " elements (a checkpoint of another model or layout)");
    return backend_->upload(it->second, into);
  };
  for (const plan::Parameter &p : plan_.parameters())
    LOOM_RETURN_IF_ERROR(take("param/" + p.name(), driver_.parameter(p.name())));
  LOOM_RETURN_IF_ERROR(driver_.parametersChanged());
  if (plan_.zero1() && f.metadata["flat_layout"] != flatLayoutOf(plan_))
    return Status::error(path + ": its ZeRO-1 optimizer state was written for another flat parameter layout (flat_layout " +
                         (f.metadata["flat_layout"].empty() ? "absent" : f.metadata["flat_layout"]) + ", this plan's " +
                         flatLayoutOf(plan_) + "): resume with the plans it was trained with");
  for (const char *moment : {"adam_m", "adam_v"}) {
    auto it = driver_.optimizerState().find(moment);
    if (it == driver_.optimizerState().end()) return Status::error("the plan's optimizer has no " + std::string(moment));
    if (plan_.zero1()) {
      if (!f.tensors.count(std::string("zero1/") + moment))
        return Status::error(path + ": no ZeRO-1 optimizer state (a checkpoint of another layout)");
      LOOM_RETURN_IF_ERROR(take(std::string("zero1/") + moment, it->second));
      continue;
    }
    for (const plan::Parameter &p : plan_.parameters())
      LOOM_RETURN_IF_ERROR(take(std::string(moment) + "/" + p.name(), driver_.sliceOf(it->second, p.name())));
  }
  if (opt_.lossScaling && f.metadata.count("fp16_loss_scale") && f.metadata.count("fp16_clean_steps")) {
    char *end = nullptr;
    double scale = std::strtod(f.metadata["fp16_loss_scale"].c_str(), &end);
    if (!(scale > 0) || *end != '\0') return Status::error(path + ": a corrupt fp16_loss_scale in the metadata");
    scaler_.restore(scale, std::strtoll(f.metadata["fp16_clean_steps"].c_str(), nullptr, 10));
  }
  *metadata = f.metadata;
  return Status::ok();
}

Status Trainer::zeroOptimizerState() {
  for (auto &[name, view] : driver_.optimizerState()) {
    HostTensor zeros{{view.count}};
    zeros.data.assign(size_t(view.count), 0.0f);
    LOOM_RETURN_IF_ERROR(backend_->upload(zeros, view));
  }
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
    HostTensor local{{p.shape().begin(), p.shape().end()}};
    if (p.shard_dim() < 0)
      local.data = full.data;
    else {
      local.data.assign(size_t(elementsOf(p)), 0.0f);
      copyShardOut(full.data, local.data, shardGeometry(local.shape, p.shard_dim()), p.shard_parts(), p.shard_index());
    }
    LOOM_RETURN_IF_ERROR(backend_->upload(local, driver_.parameter(p.name())));
  }
  LOOM_RETURN_IF_ERROR(driver_.parametersChanged());
  return zeroOptimizerState();
}

}  // namespace loom
