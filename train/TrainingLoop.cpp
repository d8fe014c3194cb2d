#include "train/TrainingLoop.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "formats/Checkpoint.h"
#include "google/protobuf/text_format.h"
#include "formats/HfConfig.h"
#include "formats/HfExport.h"
#include "formats/HfGpt2.h"
#include "formats/HfLlama.h"
#include "formats/Safetensors.h"
#include "runtime/Shards.h"

namespace loom {

double LrSchedule::at(int64_t it) const {
  if (warmupIters > 0 && it <= warmupIters) return maxLr * double(it) / double(warmupIters);
  if (decayIters <= warmupIters || it >= decayIters) return it >= decayIters && decayIters > 0 ? minLr : maxLr;
  double progress = double(it - warmupIters) / double(decayIters - warmupIters);
  return minLr + (maxLr - minLr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

TrainingLoop::TrainingLoop(Trainer &trainer, control::CoordinatorClient &client, DataSource *validation,
                           TrainingOptions options, StepClock *clock)
    : trainer_(trainer), client_(client), validation_(validation), opt_(std::move(options)), clock_(clock) {
  if (opt_.lr.decayIters == 0) opt_.lr.decayIters = opt_.trainIters;
}

TrainingLoop::~TrainingLoop() {
  if (saver_.joinable()) saver_.join();
}

Status TrainingLoop::finishAsyncSave() {
  if (saver_.joinable()) saver_.join();
  Status s = saverStatus_;
  saverStatus_ = Status::ok();
  return s;
}

bool TrainingLoop::logs() const {
  const plan::RankPlan &p = trainer_.plan();
  return trainer_.isLossRank() && p.tp_rank() == 0 && p.dp_rank() == 0 && p.cp_rank() == 0;
}

int64_t residentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return -1;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

namespace {

double peakMemoryMiB() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}


// (t,p,d,v), c, ep and whether the optimizer state is sharded: what a checkpoint records of the
// layout that wrote it (any layout resumes it).
std::string layoutOf(const plan::RankPlan &p) {
  return std::to_string(p.t()) + "," + std::to_string(p.p()) + "," + std::to_string(p.d()) + "," +
         std::to_string(p.v()) + (p.c() > 1 ? ",c" + std::to_string(p.c()) : "") +
         (p.cluster().parallel().expert_parallel_size() > 1
              ? ",e" + std::to_string(p.cluster().parallel().expert_parallel_size())
              : "") +
         (p.zero1() ? ",zero1" : "");
}

// "dim,parts,index,global dims...": where a shard sits in its parameter (dim -1: replicated).
std::string shardInfo(const plan::Parameter &p) {
  std::string s = std::to_string(p.shard_dim()) + "," + std::to_string(p.shard_parts()) + "," +
                  std::to_string(p.shard_index());
  for (int64_t d : p.global_shape()) s += "," + std::to_string(d);
  return s;
}

// The losses a step reports, by name, as Megatron logs them: the loss as "lm loss" when it is
// one cross-entropy; each term by its name when it sums several (pretrain_bert: lm loss, sop loss).
std::vector<std::pair<std::string, double>> namedLosses(double loss,
                                                        const std::vector<std::pair<std::string, double>> &terms) {
  if (terms.empty()) return {{"lm loss", loss}};
  return terms;
}

// One step's MoE routing (loom-rank --dump-routing, which the oracle reads): "layer{L}_mb{M}" ->
// the micro-batch's chosen experts at that layer, [tokens x top_k] flattened (int32), and with a
// capacity factor "layer{L}_mb{M}_kept" -> those kept (-1: dropped), in
// dir/routing_step{S}_rank{R}.safetensors (S the 0-based step, as the dumped batches count),
// with the rank's tp, dp and pp coordinates in its metadata.
Status writeRouting(const std::string &dir, int64_t step, const plan::RankPlan &p, const MoeRoutingByLayer &choices) {
  SafetensorsFile f;
  auto put = [&f](const std::string &name, const std::vector<int32_t> &experts) {
    HostTensor t;
    t.isInt = true, t.shape = {int64_t(experts.size())}, t.ints = experts;
    f.tensors[name] = std::move(t);
  };
  for (const auto &[key, choice] : choices) {
    std::string name = "layer" + std::to_string(key.first) + "_mb" + std::to_string(key.second);
    put(name, choice.chosen);
    if (!choice.kept.empty()) put(name + "_kept", choice.kept);
  }
  f.metadata["tp_rank"] = std::to_string(p.tp_rank());
  f.metadata["dp_rank"] = std::to_string(p.dp_rank());
  f.metadata["pp_rank"] = std::to_string(p.pp_rank());
  std::filesystem::create_directories(dir);
  char name[64];
  std::snprintf(name, sizeof name, "/routing_step%05lld_rank%04d.safetensors", (long long)step, p.rank());
  return writeSafetensors(dir + name, f);
}

// The iteration line's part: "lm loss: X" (or "lm loss: X | sop loss: Y").
std::string lossText(const std::vector<std::pair<std::string, double>> &named) {
  std::string text;
  for (const auto &[name, value] : named) {
    char part[96];
    std::snprintf(part, sizeof part, "%s%s: %.6E", text.empty() ? "" : " | ", name.c_str(), value);
    text += part;
  }
  return text;
}

}  // namespace

// Model FLOPs of a step: the compiler's count from the IR (any architecture); for plans
// without it, the PTD-P paper's GPT formula (section 5.1, 72 = 3 x 24 in place of 96: no
// recomputation).
double modelFlopsPerStep(const plan::RankPlan &p) {
  double B = p.global_batch_size(), s = p.seq_length(), l = p.num_layers(), h = p.hidden_size(),
         V = p.padded_vocab_size();
  if (p.model_flops_per_token() > 0) return p.model_flops_per_token() * B * s;
  return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
}

Status TrainingLoop::saveCheckpoint(int64_t iteration, bool announce) {
  LOOM_RETURN_IF_ERROR(finishAsyncSave());  // at most one save in flight
  const plan::RankPlan &p = trainer_.plan();
  std::string partial = checkpointDir(opt_.save, iteration, true);
  std::error_code ec;
  std::filesystem::create_directories(partial, ec);
  if (ec) return Status::error(partial + ": cannot create: " + ec.message());
  // The file's own facts (for a person reading it); the training state goes once into
  // metadata.json, the pieces' facts are the trainer's.
  std::map<std::string, std::string> meta = {
      {"iteration", std::to_string(iteration)}, {"rank", std::to_string(p.rank())},
      {"world_size", std::to_string(p.world_size())}, {"model", p.model()}, {"layout", layoutOf(p)}};
  for (const plan::Parameter &param : p.parameters())
    if (param.unpadded_size() > 0 && param.tied_to().empty())  // "dim,size": what export keeps of the padded vocabulary
      meta["padding:" + param.name()] = std::to_string(param.padded_dim()) + "," + std::to_string(param.unpadded_size());
  std::string file = checkpointFile(partial, p.rank());
  if (opt_.asyncSave && announce) {
    // Asynchronous (Megatron's --async-save): the pieces are copied to host memory now (one save
    // in flight at most: the previous one has ended), a thread writes them while training goes
    // on, tells the coordinator's store, and rank 0's thread publishes once every rank's file is
    // complete. A crash before that leaves only the .partial directory, never a published
    // checkpoint.
    SafetensorsFile snapshot;
    LOOM_RETURN_IF_ERROR(trainer_.snapshotShard(meta, &snapshot));
    std::map<std::string, std::string> state = p.rank() == 0 ? trainingState(iteration) : std::map<std::string, std::string>{};
    bool log = logs();
    saver_ = std::thread([this, iteration, file, state, log, snapshot = std::move(snapshot)] {
      const plan::RankPlan &plan = trainer_.plan();
      std::string key = "async-save/" + std::to_string(iteration) + "/";
      Status s = writeSafetensors(file, snapshot);
      Status told = client_.kvSet(key + std::to_string(plan.rank()), s.isOk() ? "ok" : s.message());
      if (s.isOk()) s = told;
      if (s.isOk() && plan.rank() == 0) {
        for (int r = 0; r < plan.world_size() && s.isOk(); ++r) {
          std::string verdict;
          s = client_.kvGet(key + std::to_string(r), 600000, &verdict);
          if (s.isOk() && verdict != "ok") s = Status::error("rank " + std::to_string(r) + "'s checkpoint file: " + verdict);
        }
        if (s.isOk()) s = publishCheckpoint(opt_.save, iteration, plan.world_size(), state);
      }
      if (s.isOk() && log)
        std::printf(" saved checkpoint at iteration %lld to %s (written in the background)\n", (long long)iteration,
                    opt_.save.c_str());
      if (!s.isOk()) s = Status::error("the asynchronous save of iteration " + std::to_string(iteration) + ": " + s.message());
      saverStatus_ = s;
    });
    return Status::ok();
  }
  // Every rank writes its pieces at once; rank 0 draws its progress (one line on a shared terminal).
  LOOM_RETURN_IF_ERROR(trainer_.saveShard(file, meta, p.rank() == 0));
  LOOM_RETURN_IF_ERROR(client_.barrier("save-" + std::to_string(iteration), p.rank(), 600000));
  if (p.rank() == 0) LOOM_RETURN_IF_ERROR(publishCheckpoint(opt_.save, iteration, p.world_size(), trainingState(iteration)));
  LOOM_RETURN_IF_ERROR(client_.barrier("saved-" + std::to_string(iteration), p.rank(), 600000));
  if (logs() && announce) std::printf(" saved checkpoint at iteration %lld to %s\n", (long long)iteration, opt_.save.c_str());
  return Status::ok();
}

// The model's facts a Hugging Face conversion needs (loom-ckpt convert reads them back): a rank
// plan holding only them, in protobuf text.
static std::string modelFactsOf(const plan::RankPlan &p) {
  plan::RankPlan f;
  f.set_model(p.model()), f.set_architecture(p.architecture()), f.set_vocab_size(p.vocab_size());
  f.set_padded_vocab_size(p.padded_vocab_size()), f.set_num_layers(p.num_layers()), f.set_hidden_size(p.hidden_size());
  f.set_num_attention_heads(p.num_attention_heads()), f.set_num_key_value_heads(p.num_key_value_heads());
  f.set_ffn_hidden_size(p.ffn_hidden_size()), f.set_max_position_embeddings(p.max_position_embeddings());
  f.set_norm_epsilon(p.norm_epsilon()), f.set_rope_theta(p.rope_theta());
  f.set_tie_word_embeddings(p.tie_word_embeddings()), f.set_seq_length(p.seq_length());
  f.set_num_experts(p.num_experts()), f.set_num_experts_per_tok(p.num_experts_per_tok());
  f.set_moe_layer_freq(p.moe_layer_freq()), f.set_router_aux_loss_coef(p.router_aux_loss_coef());
  f.set_capacity_factor(p.capacity_factor());
  std::string text;
  google::protobuf::TextFormat::PrintToString(f, &text);
  return text;
}

// What a checkpoint keeps once, independent of the layout: the position in training (the data
// is read by sample index, so iteration x global batch is the consumed samples), the schedule's
// facts, fp16's loss scale. Dropout needs nothing: its masks are counter-based over global
// positions and the seed.
std::map<std::string, std::string> TrainingLoop::trainingState(int64_t iteration) const {
  const plan::RankPlan &p = trainer_.plan();
  auto print = [](const char *format, double v) {
    char text[40];
    std::snprintf(text, sizeof text, format, v);
    return std::string(text);
  };
  auto number = [&](double v) { return print("%.17g", v); };  // read back exactly (the loss scale)
  auto rate = [&](double v) { return print("%.6g", v); };     // for a person
  std::map<std::string, std::string> state = {
      {"iteration", std::to_string(iteration)},
      {"model", p.model()},
      {"architecture", p.architecture()},
      {"layout", layoutOf(p)},
      {"global_batch_size", std::to_string(p.global_batch_size())},
      {"consumed_samples", std::to_string(iteration * p.global_batch_size())},
      {"skipped_steps", std::to_string(skipped_)},
      {"lr", rate(opt_.lr.maxLr)},
      {"min_lr", rate(opt_.lr.minLr)},
      {"warmup_iters", std::to_string(opt_.lr.warmupIters)},
      {"decay_iters", std::to_string(opt_.lr.decayIters)},
      {"learning_rate", rate(opt_.lr.at(std::max<int64_t>(iteration, 1)))}};
  state["model_facts"] = modelFactsOf(p);
  if (trainer_.options().lossScaling) {
    state["fp16_loss_scale"] = number(trainer_.lossScaler().scale());
    state["fp16_clean_steps"] = std::to_string(trainer_.lossScaler().cleanSteps());
  }
  return state;
}

// --resume: the newest checkpoint every rank can verify (its file against the manifest's size
// and checksum). The ranks agree through the coordinator's key-value store, so all of them
// fall back together; with --strict-resume the first unusable checkpoint stops the run.
Status TrainingLoop::loadCheckpoint(int64_t *iteration) {
  const plan::RankPlan &p = trainer_.plan();
  std::vector<int64_t> candidates;
  std::string note;
  resumeCandidates(opt_.save, &candidates, &note);
  *iteration = 0;  // nothing to resume from: the run starts at iteration 1 (never at 0, batch -1)
  if (!note.empty()) {
    if (opt_.strictResume) return Status::error(note + " (--strict-resume)");
    if (logs()) std::fprintf(stderr, "warning: %s; resuming from the newest complete checkpoint\n", note.c_str());
  }
  if (candidates.empty()) return Status::ok();  // nothing to resume: start from scratch
  CheckpointIndex index;
  for (size_t c = 0; c < candidates.size(); ++c) {
    int64_t it = candidates[c];
    // Each rank reads the pieces it needs (any layout wrote them), checked against their
    // checksums; the ranks agree on the outcome through the coordinator's store, so all of them
    // fall back together.
    Status mine = readVerifiedCheckpointIndex(opt_.save, it, &index);
    if (mine.isOk()) mine = checkState(index);
    if (mine.isOk()) mine = trainer_.loadResharded(resolvedCheckpointDir(opt_.save, it), index, p.rank() == 0);
    std::string key = "resume-check/" + std::to_string(it) + "/";
    LOOM_RETURN_IF_ERROR(client_.kvSet(key + std::to_string(p.rank()), mine.isOk() ? "ok" : mine.message()));
    std::string failure;
    for (int r = 0; r < p.world_size() && failure.empty(); ++r) {
      std::string verdict;
      LOOM_RETURN_IF_ERROR(client_.kvGet(key + std::to_string(r), 600000, &verdict));
      if (verdict != "ok") failure = verdict;
    }
    if (failure.empty()) {
      *iteration = it;
      break;
    }
    std::string what = "checkpoint at iteration " + std::to_string(it) + " is unusable: " + failure;
    if (opt_.strictResume) return Status::error(what + " (--strict-resume)");
    if (c + 1 == candidates.size())
      return Status::error(what + "; no older complete checkpoint in " + opt_.save);
    if (logs())
      std::fprintf(stderr, "warning: %s; resuming from iteration %lld instead\n", what.c_str(),
                   (long long)candidates[c + 1]);
  }
  skipped_ = std::strtoll(index.state["skipped_steps"].c_str(), nullptr, 10);
  if (trainer_.options().lossScaling && index.state.count("fp16_loss_scale")) {
    double scale = std::strtod(index.state["fp16_loss_scale"].c_str(), nullptr);
    trainer_.restoreLossScaler(scale, std::strtoll(index.state["fp16_clean_steps"].c_str(), nullptr, 10));
  }
  if (logs())
    std::printf(" resumed from checkpoint at iteration %lld in %s (written with %s, resumed with %s)\n",
                (long long)*iteration, opt_.save.c_str(), index.state["layout"].c_str(), layoutOf(p).c_str());
  return Status::ok();
}

// The state a resume can continue from: the same model and global batch (the data position and
// the schedule count iterations of it); any layout.
Status TrainingLoop::checkState(const CheckpointIndex &index) const {
  const plan::RankPlan &p = trainer_.plan();
  auto get = [&](const char *key) {
    auto it = index.state.find(key);
    return it == index.state.end() ? std::string() : it->second;
  };
  if (get("model") != p.model())
    return Status::error("written by model '" + get("model") + "', this job runs '" + p.model() + "'");
  // At iteration 0 (a checkpoint converted from Hugging Face) nothing has been consumed yet.
  if (index.iteration > 0 && get("global_batch_size") != std::to_string(p.global_batch_size()))
    return Status::error("written with global batch size " + get("global_batch_size") + ", this job's is " +
                         std::to_string(p.global_batch_size()) + " (resume with the same global batch)");
  if (get("iteration") != std::to_string(index.iteration)) return Status::error("metadata.json: corrupt state iteration");
  char *end = nullptr;
  std::string skipped = get("skipped_steps");
  long long n = std::strtoll(skipped.c_str(), &end, 10);
  if (skipped.empty() || *end != '\0' || n < 0 || n > index.iteration)
    return Status::error("metadata.json: corrupt state skipped_steps '" + skipped + "'");
  if (trainer_.options().lossScaling && index.state.count("fp16_loss_scale")) {
    double scale = std::strtod(get("fp16_loss_scale").c_str(), &end);
    if (!(scale > 0) || *end != '\0') return Status::error("metadata.json: corrupt fp16_loss_scale");
  }
  return Status::ok();
}

Status TrainingLoop::validate(int64_t iteration) {
  std::vector<std::pair<std::string, double>> means;  // each named loss: summed over the batches, then the mean
  for (int64_t k = 0; k < opt_.evalIters; ++k) {
    double loss = 0;
    std::vector<std::pair<std::string, double>> terms;
    LOOM_RETURN_IF_ERROR(trainer_.evaluate(validation_, k, &loss, &terms));
    std::vector<std::pair<std::string, double>> named = namedLosses(loss, terms);
    if (means.empty()) means.assign(named.size(), {"", 0.0});
    for (size_t j = 0; j < named.size() && j < means.size(); ++j)
      means[j].first = named[j].first, means[j].second += named[j].second;
  }
  for (auto &mean : means) mean.second /= opt_.evalIters;
  if (logs()) {
    // Megatron's validation line: "<name> value" and "<name> PPL" for each loss.
    std::string values;
    std::map<std::string, double> scalars;
    for (const auto &[name, value] : means) {
      char text[160];
      std::snprintf(text, sizeof text, " | %s value: %.6E | %s PPL: %.6E", name.c_str(), value, name.c_str(),
                    std::exp(value));
      values += text;
      scalars[name + " validation"] = value, scalars[name + " validation ppl"] = std::exp(value);
    }
    std::printf("-----------------------------------------------------------------------------------------------\n"
                " validation loss at iteration %lld%s\n"
                "-----------------------------------------------------------------------------------------------\n",
                (long long)iteration, values.c_str());
    std::fflush(stdout);
    LOOM_RETURN_IF_ERROR(writeScalars(iteration, scalars));
  }
  return Status::ok();
}

// Rank 0 gathers nothing over the network: every rank writes its shards (with their slice
// facts) into a checkpoint, then rank 0 assembles the whole model from the files.

Status TrainingLoop::exportModel(int64_t iteration, bool savedThere) {
  const plan::RankPlan &p = trainer_.plan();
  // Without a checkpoint of the iteration in --save the shards go to a directory beside the
  // export, removed after; one that exists already (checked by every rank before any writes) is
  // not ours to use or remove.
  std::string root = savedThere ? opt_.save : opt_.exportPath + ".shards";
  if (!savedThere) {
    bool existed = std::filesystem::exists(root);
    LOOM_RETURN_IF_ERROR(client_.barrier("export-check", p.rank(), 600000));
    if (existed) return Status::error(root + ": exists already (the export writes its shards there); remove it");
    std::swap(opt_.save, root);
    Status s = saveCheckpoint(iteration, /*announce=*/false);
    std::swap(opt_.save, root);
    LOOM_RETURN_IF_ERROR(s);
  }
  if (p.rank() != 0) return Status::ok();
  std::map<std::string, HostTensor> global;
  LOOM_RETURN_IF_ERROR(readWholeTensors(root, iteration, "param/", &global));
  // The export's directory is made as save_pretrained makes it (with --save nothing else has).
  std::filesystem::path dir = std::filesystem::path(opt_.exportPath).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return Status::error(dir.string() + ": cannot create the export's directory: " + ec.message());
  HfExport written;
  LOOM_RETURN_IF_ERROR(writeHuggingFace(p, global, nullptr, nullptr, opt_.exportPath, &written));
  if (!savedThere) std::filesystem::remove_all(root);
  std::printf(" exported %zu tensors (%s) to %s%s\n", written.tensors, written.className().c_str(),
              opt_.exportPath.c_str(), written.configPath.empty() ? "" : (", " + written.configPath).c_str());
  return Status::ok();
}

// At a log iteration every rank reports its compute time per iteration since the last one (its
// own kernels, not its waits) and its pipeline stage, through the reporter thread; the logging
// rank's line gets the newest straggler verdict that has arrived (a rank more than 10% above
// the median of its stage's ranks), or "".
std::string TrainingLoop::reportMetrics(int64_t it, bool skipped, bool logIteration) {
  if (!logIteration) return "";
  if (iterationsInInterval_ > 0)
    reporter_->report(it, computeInInterval_ / double(iterationsInInterval_), trainer_.plan().pp_rank(),
                      logs() && !skipped);
  computeInInterval_ = 0, iterationsInInterval_ = 0;
  return reporter_->takeVerdict();
}

Status TrainingLoop::gatherMoeStatistics(int64_t it, bool *have, double *auxLoss, double *droppedFraction) {
  const plan::RankPlan &p = trainer_.plan();
  *have = p.num_experts() > 0;
  if (!*have) return Status::ok();
  MoeTally mine = trainer_.takeMoeTally();
  char text[160];
  std::snprintf(text, sizeof text, "%.17g %lld %lld %lld", mine.auxSum, (long long)mine.layers, (long long)mine.dropped,
                (long long)mine.assigned);
  auto key = [it](int rank) { return "moe-statistics/" + std::to_string(it) + "/" + std::to_string(rank); };
  LOOM_RETURN_IF_ERROR(client_.kvSet(key(p.rank()), text));
  if (!logs()) return Status::ok();
  // Every rank's, tensor-parallel replicas included: they add the same to both sums of a mean.
  MoeTally all;
  for (int r = 0; r < p.world_size(); ++r) {
    std::string value;
    LOOM_RETURN_IF_ERROR(client_.kvGet(key(r), kMoeStatisticsWaitMs, &value));
    double aux = 0;
    long long layers = 0, dropped = 0, assigned = 0;
    if (std::sscanf(value.c_str(), "%lf %lld %lld %lld", &aux, &layers, &dropped, &assigned) != 4)
      return Status::error("rank " + std::to_string(r) + " posted unreadable MoE statistics '" + value + "'");
    all.auxSum += aux, all.layers += layers, all.dropped += dropped, all.assigned += assigned;
  }
  *auxLoss = all.layers > 0 ? all.auxSum / double(all.layers) : 0;
  *droppedFraction = all.assigned > 0 ? double(all.dropped) / double(all.assigned) : 0;
  return Status::ok();
}

Status TrainingLoop::writeScalars(int64_t step, const std::map<std::string, double> &values) {
  if (tensorboard_) LOOM_RETURN_IF_ERROR(tensorboard_->scalars(step, values));
  if (metricsFile_) LOOM_RETURN_IF_ERROR(metricsFile_->scalars(step, values));
  return Status::ok();
}

Status TrainingLoop::run() {
  const plan::RankPlan &p = trainer_.plan();
  int64_t start = 0;
  if (logs() && !opt_.tensorboardDir.empty()) LOOM_RETURN_IF_ERROR(TensorBoardWriter::open(opt_.tensorboardDir, &tensorboard_));
  if (logs() && !opt_.metricsFile.empty()) LOOM_RETURN_IF_ERROR(MetricsFileWriter::open(opt_.metricsFile, &metricsFile_));
  if (opt_.resume) LOOM_RETURN_IF_ERROR(loadCheckpoint(&start));
  if (opt_.asyncSave && !opt_.save.empty() && logs())
    std::printf(" asynchronous checkpoints: %.1f MiB of host memory on this rank for the copy in flight (one save at a "
                "time), besides the plan's memory\n",
                double(trainer_.checkpointBytes()) / (1 << 20));
  double tokensPerStep = double(p.global_batch_size()) * p.seq_length();
  reporter_ = std::make_unique<StragglerReporter>(client_, p.rank(), logs() ? kStragglerWaitMs : 0);
  // Megatron's interval time: the wall time from one log line to the next, all of it (data,
  // the step, reports, logging) but validation and checkpoint saves, per iteration.
  auto intervalStart = std::chrono::steady_clock::now();
  int64_t intervalIterations = 0;
  trainer_.setLogRouting(!opt_.dumpRouting.empty());
  for (int64_t it = start + 1; it <= opt_.trainIters; ++it) {
    clock_->step = it;
    auto iterationStart = std::chrono::steady_clock::now();
    StepResult r;
    double computeBefore = std::max(0.0, trainer_.computeSeconds());
    LOOM_RETURN_IF_ERROR(trainer_.computeGradients(it - 1, &r));
    if (!opt_.dumpRouting.empty()) LOOM_RETURN_IF_ERROR(writeRouting(opt_.dumpRouting, it - 1, p, trainer_.takeMoeRouting()));
    if (it == 1 && !opt_.dumpGrads.empty()) {
      SafetensorsFile f;
      std::map<std::string, HostTensor> grads;
      LOOM_RETURN_IF_ERROR(trainer_.hostGradients(&grads));
      for (const plan::Parameter &param : p.parameters()) {
        f.tensors[param.name()] = grads.at(param.name());
        f.metadata[param.name()] = shardInfo(param);
        // Before the optimizer's cross-stage sum, a tied copy holds its stage's part only.
        if (!param.tied_to().empty()) f.metadata["tied:" + param.name()] = param.tied_to();
      }
      char loss[32];
      std::snprintf(loss, sizeof loss, "%.9g", r.loss);
      if (r.hasLoss) f.metadata["__loss__"] = loss;
      // ZeRO-1: some buckets hold each replica's own gradients (the optimizer reduces them): the
      // reader averages the replicas (the reduced ones are the same on every replica).
      f.metadata["__dp_synchronized__"] = trainer_.gradientsSynchronized() ? "true" : "false";
      std::filesystem::create_directories(opt_.dumpGrads);
      LOOM_RETURN_IF_ERROR(
          writeSafetensors(opt_.dumpGrads + "/grads_rank" + std::to_string(p.rank()) + ".safetensors", f));
    }
    if (r.hasLoss && !std::isfinite(r.loss) && !r.lossScale)
      return Status::error("the loss is " + std::to_string(r.loss) + " at iteration " + std::to_string(it) +
                           ": stopping before the update (no checkpoint of this state is written)");
    // Skipped fp16 steps neither update nor advance the learning-rate schedule or AdamW's step
    // count (as in Megatron-LM); `update` is the 1-based count of updates with this one.
    int64_t update = it - skipped_;
    double norm = 0, lr = opt_.lr.at(update);
    bool skipped = false;
    Status st = trainer_.optimizerStep(update, lr, opt_.clipGrad, &norm, &skipped);
    if (!st.isOk()) return Status::error(st.message() + " (iteration " + std::to_string(it) + ")");
    if (double computeAfter = trainer_.computeSeconds(); computeAfter >= 0) {
      computeInInterval_ += computeAfter - computeBefore;
      ++iterationsInInterval_;
    }
    bool logIteration = it % opt_.logInterval == 0 || it == opt_.trainIters;
    std::string straggler = reportMetrics(it, skipped, logIteration);
    ++intervalIterations;
    double seconds = 0;
    if (logIteration) {
      auto now = std::chrono::steady_clock::now();
      seconds = std::chrono::duration<double>(now - intervalStart).count() / double(intervalIterations);
      intervalStart = now, intervalIterations = 0;
    }
    if (skipped) {
      // fp16 dynamic loss scaling: an inf/NaN gradient on some rank; every rank skipped the update.
      ++skipped_;
      if (logs())
        std::printf(" iteration %8lld/%8lld | skipped: inf/NaN gradients at loss scale %.0f (halved)\n",
                    (long long)it, (long long)opt_.trainIters, r.lossScale);
    }
    bool moe = false;
    double auxLoss = 0, droppedFraction = 0;
    if (logIteration) LOOM_RETURN_IF_ERROR(gatherMoeStatistics(it, &moe, &auxLoss, &droppedFraction));
    if (!skipped && logs() && logIteration) {
      // Megatron-Core's MoE logging: the load-balancing loss averaged over the MoE layers (and
      // micro-batches and replicas), and here the share of assignments capacity dropped.
      char moeText[96] = "";
      if (moe)
        std::snprintf(moeText, sizeof moeText, " | load balancing loss: %.6E | dropped assignments: %.2f%%", auxLoss,
                      100 * droppedFraction);
      double mfu = p.device_peak_flops() > 0
                       ? modelFlopsPerStep(p) / (seconds * p.world_size() * p.device_peak_flops())
                       : 0;
      // Megatron's log line; an fp16 run's loss scale after the loss, as Megatron prints it.
      std::vector<std::pair<std::string, double>> named = namedLosses(r.loss, r.lossTerms);
      char scale[48] = "";
      if (r.lossScale > 0) std::snprintf(scale, sizeof scale, " | loss scale: %.1f", r.lossScale);
      std::printf(" iteration %8lld/%8lld | consumed samples: %10lld | elapsed time per iteration (ms): %.1f | "
                  "learning rate: %.3E | global batch size: %5d | %s%s%s | grad norm: %.3f | "
                  "tokens per second: %.0f | MFU: %.1f%% | peak memory (MiB): %.1f%s\n",
                  (long long)it, (long long)opt_.trainIters, (long long)(it * p.global_batch_size()), seconds * 1000,
                  lr, p.global_batch_size(), lossText(named).c_str(), moeText, scale, norm,
                  tokensPerStep / seconds, 100 * mfu, peakMemoryMiB(), straggler.c_str());
      std::fflush(stdout);
      // Megatron-LM's TensorBoard scalars (throughput: model TFLOP/s per device).
      std::map<std::string, double> scalars = {
          {"learning-rate", lr}, {"grad-norm", norm}, {"iteration-time", seconds},
          {"throughput", modelFlopsPerStep(p) / (seconds * p.world_size()) / 1e12}, {"mem-peak", peakMemoryMiB()},
          {"tokens-per-second", tokensPerStep / seconds}};
      for (const auto &[name, value] : named) scalars[name] = value;
      if (r.lossScale > 0) scalars["loss-scale"] = r.lossScale;
      if (moe) scalars["load_balancing_loss"] = auxLoss, scalars["moe-dropped-fraction"] = droppedFraction;
      LOOM_RETURN_IF_ERROR(writeScalars(it, scalars));
    }
    if (it == start + 1) {  // every rank: what it holds against what its plan says
      double planned = double(p.memory().peak_bytes()), held = double(trainer_.allocatedBytes());
      std::string growth;
      if (int64_t now = residentBytes(); now >= 0 && opt_.baselineResidentBytes >= 0) {
        char text[96];
        std::snprintf(text, sizeof text, "; the process grew by %.2f MiB since before the trainer",
                      double(now - opt_.baselineResidentBytes) / (1 << 20));
        growth = text;
      }
      std::printf(" rank %d memory: planned peak %.2f MiB, allocated by the backend %.2f MiB (%+lld bytes, %+.1f%%)%s\n",
                  p.rank(), planned / (1 << 20), held / (1 << 20), (long long)(held - planned),
                  planned > 0 ? 100 * (held - planned) / planned : 0.0, growth.c_str());
      std::fflush(stdout);
    }
    if (logs() && !skipped && !opt_.lossLog.empty()) {
      FILE *f = std::fopen(opt_.lossLog.c_str(), "a");
      if (!f) return Status::error(opt_.lossLog + ": cannot append");
      // iteration, loss, grad norm[, the loss scale of an fp16 run's iteration]
      if (r.lossScale > 0)
        std::fprintf(f, "%lld %.9g %.9g %.9g\n", (long long)it, r.loss, norm, r.lossScale);
      else
        std::fprintf(f, "%lld %.9g %.9g\n", (long long)it, r.loss, norm);
      std::fclose(f);
    }
    auto pause = std::chrono::steady_clock::now();  // validation and saves are not iteration time
    double iterationSeconds = std::chrono::duration<double>(pause - iterationStart).count();
    if (iterationSeconds > clock_->longestSeconds) clock_->longestSeconds = iterationSeconds;
    if (validation_ && opt_.evalInterval > 0 && (it % opt_.evalInterval == 0 || it == opt_.trainIters))
      LOOM_RETURN_IF_ERROR(validate(it));
    if (!opt_.save.empty() && ((opt_.saveInterval > 0 && it % opt_.saveInterval == 0) || it == opt_.trainIters))
      LOOM_RETURN_IF_ERROR(saveCheckpoint(it));
    intervalStart += std::chrono::steady_clock::now() - pause;
  }
  LOOM_RETURN_IF_ERROR(finishAsyncSave());
  // The last iteration run was saved in --save (a run that trained none: the checkpoint it
  // resumed from, if any).
  bool trained = start < opt_.trainIters;
  int64_t last = trained ? opt_.trainIters : start;
  if (!opt_.exportPath.empty())
    LOOM_RETURN_IF_ERROR(exportModel(last, !opt_.save.empty() && (trained || start > 0)));
  return Status::ok();
}

}  // namespace loom
