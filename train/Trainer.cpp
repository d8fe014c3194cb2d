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
#include "formats/CheckpointPieces.h"

namespace loom {
namespace {

int64_t elementsOf(const plan::Parameter &p) {
  int64_t n = 1;
  for (int64_t d : p.shape()) n *= d;
  return n;
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
  LOOM_RETURN_IF_ERROR(driver_.runGradients(data_, step, /*evaluate=*/false, &result->hasLoss, &result->loss));
  if (result->hasLoss) result->lossTerms = driver_.lossTerms();
  return Status::ok();
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

Status Trainer::evaluate(DataSource *data, int64_t batch, double *loss,
                         std::vector<std::pair<std::string, double>> *lossTerms) {
  bool hasLoss = false;
  *loss = 0;
  LOOM_RETURN_IF_ERROR(driver_.runGradients(data, batch, /*evaluate=*/true, &hasLoss, loss));
  if (lossTerms) *lossTerms = hasLoss ? driver_.lossTerms() : std::vector<std::pair<std::string, double>>{};
  return Status::ok();
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
  // Sharded master weights are never whole on a rank: gatherParameters says so.
  LOOM_RETURN_IF_ERROR(driver_.gatherParameters());
  LOOM_RETURN_IF_ERROR(backend_->synchronize());
  for (const plan::Parameter &p : plan_.parameters()) {
    HostTensor &t = (*out)[p.name()];
    t.shape.assign(p.shape().begin(), p.shape().end());
    LOOM_RETURN_IF_ERROR(backend_->download(driver_.parameter(p.name()), &t.data));
  }
  return Status::ok();
}

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

std::string xxh3Of(const std::vector<float> &data) {
  return checksumHex(checksum64(data.data(), data.size() * sizeof(float)));
}

ArgumentView range(ArgumentView v, int64_t offset, int64_t count) {
  v.f += offset;
  v.count = count;
  return v;
}
}  // namespace

Status Trainer::saveShard(const std::string &path, const std::map<std::string, std::string> &metadata, bool progress) {
  SafetensorsFile f;
  LOOM_RETURN_IF_ERROR(snapshotShard(metadata, &f));
  std::unique_ptr<ProgressMeter> meter;
  return writeSafetensors(path, f, shardProgress(progress, "saving the checkpoint (this rank's shard)", &meter));
}

int64_t Trainer::checkpointBytes() const {
  int64_t n = 0;
  for (const StatePiece &s : piecesToSave(plan_)) n += 4 * s.piece.elements();
  return n;
}

Status Trainer::snapshotShard(const std::map<std::string, std::string> &metadata, SafetensorsFile *out) {
  SafetensorsFile &f = *out;
  f.metadata = metadata;
  LOOM_RETURN_IF_ERROR(backend_->synchronize());
  // The whole parameters (a collective with ZeRO-1: every rank gathers), unless the fp32 master
  // weights are sharded: then their pieces are the rank's parts, in the optimizer state.
  std::map<std::string, HostTensor> params;
  if (!driver_.mastersSharded()) LOOM_RETURN_IF_ERROR(hostParameters(&params));
  std::map<std::string, std::vector<float>> state;  // the rank's whole optimizer state, by storage
  std::vector<std::string> storages = {"adam_m", "adam_v"};
  if (driver_.mastersSharded()) storages.push_back(kMasterWeights);
  for (const std::string &storage : storages) {
    auto it = driver_.optimizerState().find(storage);
    if (it == driver_.optimizerState().end()) return Status::error("the plan's optimizer has no " + storage);
    LOOM_RETURN_IF_ERROR(backend_->download(it->second, &state[storage]));
  }
  std::map<std::string, int64_t> flatOffset;
  for (const plan::Parameter &p : plan_.parameters()) flatOffset[p.name()] = p.flat_offset();
  for (const StatePiece &s : piecesToSave(plan_)) {
    const std::vector<float> *from;
    int64_t at;
    if (s.storage == "param") {
      from = &params.at(s.parameter).data, at = s.piece.flatBegin;
    } else {
      auto held = state.find(s.storage);
      if (held == state.end()) return Status::error("checkpoint: piece " + s.tensor + " names state '" + s.storage + "'");
      from = &held->second;
      at = s.flatMoments ? s.offset : flatOffset.at(s.parameter) + s.piece.flatBegin;
    }
    if (at < 0 || at + s.piece.elements() > int64_t(from->size()))
      return Status::error("checkpoint: piece " + s.tensor + " lies outside this rank's state (corrupt plan)");
    HostTensor t{{s.piece.elements()}};
    t.data.assign(from->begin() + at, from->begin() + at + s.piece.elements());
    f.metadata["piece:" + s.tensor] = pieceFact(s.tensor, s.globalShape, encodePiece(s.piece), xxh3Of(t.data));
    f.tensors[s.tensor] = std::move(t);
  }
  return Status::ok();
}

Status Trainer::loadResharded(const std::string &dir, const CheckpointIndex &index, bool progress) {
  CheckpointReader reader(dir, index);
  std::map<std::string, const plan::Parameter *> byName;
  for (const plan::Parameter &p : plan_.parameters()) byName[p.name()] = &p;
  std::vector<StatePiece> needs = piecesToLoad(plan_);
  std::unique_ptr<ProgressMeter> meter;
  if (progress) meter.reset(new ProgressMeter("loading the checkpoint (this rank's pieces)", int64_t(needs.size()), "pieces"));
  int64_t done = 0;
  for (const StatePiece &need : needs) {
    auto t = index.tensors.find(need.tensor);
    if (t == index.tensors.end())
      return Status::error(dir + ": no tensor '" + need.tensor + "' (a checkpoint of another model)");
    const plan::Parameter &param = *byName.at(need.parameter);
    // The same global shape, but for the vocabulary padding (the padded rows are zeros).
    bool same = t->second.shape.size() == need.globalShape.size();
    for (size_t k = 0; same && k < need.globalShape.size(); ++k)
      same = t->second.shape[k] == need.globalShape[k] ||
             (param.unpadded_size() > 0 && int(k) == param.padded_dim() && t->second.shape[k] >= param.unpadded_size());
    if (!same) {
      auto text = [](const std::vector<int64_t> &v) {
        std::string s;
        for (int64_t d : v) s += (s.empty() ? "" : "x") + std::to_string(d);
        return s;
      };
      return Status::error(dir + ": tensor '" + need.tensor + "' is " + text(t->second.shape) + ", this plan's " +
                           text(need.globalShape) + " (a checkpoint of another model)");
    }
    HostTensor host{{need.piece.elements()}};
    host.data.assign(size_t(need.piece.elements()), 0.0f);
    LOOM_RETURN_IF_ERROR(reader.read(need.tensor, need.piece, host.data.data()));
    ArgumentView to;
    if (need.storage == "param") {
      to = driver_.parameter(need.parameter);
    } else {
      auto it = driver_.optimizerState().find(need.storage);
      if (it == driver_.optimizerState().end()) return Status::error("the plan's optimizer has no " + need.storage);
      to = need.flatMoments ? range(it->second, need.offset, need.piece.elements())
                            : driver_.sliceOf(it->second, need.parameter);
    }
    if (to.count != need.piece.elements())
      return Status::error("checkpoint: '" + need.tensor + "' does not fit this rank's state (corrupt plan)");
    LOOM_RETURN_IF_ERROR(backend_->upload(host, to));
    if (meter) meter->update(++done);
  }
  if (meter) meter->finish();
  return driver_.parametersChanged();
}

Status Trainer::zeroOptimizerState() {
  for (auto &[name, view] : driver_.optimizerState()) {
    if (name == kMasterWeights) continue;  // the weights, not the optimizer's running state
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
    LOOM_RETURN_IF_ERROR(driver_.writeParameter(p.name(), local));
  }
  LOOM_RETURN_IF_ERROR(driver_.parametersChanged());
  return zeroOptimizerState();
}

}  // namespace loom
