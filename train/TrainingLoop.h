// Megatron's training recipe around a Trainer: learning-rate warm-up then cosine decay,
// global gradient-norm clipping, AdamW, a log line per iteration, periodic validation loss
// and perplexity, sharded checkpoints and bit-exact resumption.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "data/DataSource.h"
#include "runtime/control/CoordinatorClient.h"
#include "train/MetricsWriters.h"
#include "train/StragglerReporter.h"
#include "train/Trainer.h"

namespace loom {

// Model FLOPs of one training step of the whole job without recomputation:
// 72 B s l h^2 (1 + s / 6h + V / 12 l h), the count MFU is quoted against.
double modelFlopsPerStep(const plan::RankPlan &p);

// The process's resident memory now (Linux: /proc/self/statm), -1 when unknown.
int64_t residentBytes();

struct LrSchedule {
  double maxLr = 3e-4, minLr = 3e-5;
  int64_t warmupIters = 0, decayIters = 0;  // decayIters 0: the whole run
  // Learning rate of 1-based iteration `it`: linear warm-up, then cosine down to minLr.
  double at(int64_t it) const;
};

struct TrainingOptions {
  int64_t trainIters = 1;
  LrSchedule lr;
  double clipGrad = 1.0;  // 0: no clipping
  int64_t logInterval = 1;
  int64_t evalInterval = 0, evalIters = 1;  // 0: no validation
  std::string save;                         // checkpoint root ("" = no checkpoints)
  int64_t saveInterval = 0;
  bool asyncSave = false;                   // checkpoints written by a thread while training goes on
  bool resume = false;                      // continue from the latest checkpoint in `save`
  bool strictResume = false;                // an unusable latest checkpoint stops the run (no fallback)
  std::string dumpGrads;                    // write the first step's gradients (tests)
  std::string dumpRouting;                  // write every step's MoE routing choices and kept assignments (the oracle)
  std::string exportPath;                   // whole-model safetensors after training (HF GPT-2 names)
  std::string lossLog;                      // "iteration loss" lines, full precision (tests)
  std::string tensorboardDir;               // TensorBoard event files ("" = none)
  std::string metricsFile;                  // the same scalars as JSON lines ("" = none)
  int64_t baselineResidentBytes = -1;       // the process's resident memory before the trainer existed
};

// What the rank's heartbeat reports of the loop: the iteration in progress, and the longest
// finished iteration's wall time without validation and saves (the coordinator's stall limit).
struct StepClock {
  std::atomic<int64_t> step{0};
  std::atomic<double> longestSeconds{0};
};

class TrainingLoop {
 public:
  TrainingLoop(Trainer &trainer, control::CoordinatorClient &client, DataSource *validation,
               TrainingOptions options, StepClock *clock);
  ~TrainingLoop();  // waits for a save in flight
  Status run();

 private:
  // announce: log the save (not for the export's own shards, which are removed after).
  Status saveCheckpoint(int64_t iteration, bool announce = true);
  // --async-save: waits for the save in flight (its writer thread) and returns how it ended.
  Status finishAsyncSave();
  Status loadCheckpoint(int64_t *iteration);
  std::map<std::string, std::string> trainingState(int64_t iteration) const;
  Status checkState(const CheckpointIndex &index) const;
  Status validate(int64_t iteration);
  // The model after `iteration` as a Hugging Face checkpoint, assembled from the checkpoint of
  // that iteration in --save (savedThere) or from shards written beside the export for it.
  Status exportModel(int64_t iteration, bool savedThere);
  bool logs() const;
  std::string reportMetrics(int64_t iteration, bool skipped, bool logIteration);
  // Mixture of experts at a log iteration: every rank posts its statistics since the last log
  // line to the coordinator's store; the logging rank sums every rank's into the mean
  // load-balancing loss per MoE layer run and the fraction of assignments dropped (false in
  // *have: a dense model).
  Status gatherMoeStatistics(int64_t iteration, bool *have, double *auxLoss, double *droppedFraction);

  Trainer &trainer_;
  control::CoordinatorClient &client_;
  DataSource *validation_;
  TrainingOptions opt_;
  StepClock *clock_;
  int64_t skipped_ = 0;  // fp16 steps skipped so far (checkpointed)
  // --async-save: the thread writing the save in flight (its pieces already copied to host
  // memory) and, once it ended, how.
  std::thread saver_;
  Status saverStatus_ = Status::ok();
  // The straggler report: this rank's kernel time since the last log iteration.
  static constexpr int64_t kStragglerWaitMs = 2000;
  // How long the logging rank waits for every rank's MoE statistics of a log iteration (they
  // finish the same step; a dead rank is the coordinator's to report).
  static constexpr int64_t kMoeStatisticsWaitMs = 120000;
  double computeInInterval_ = 0;
  int64_t iterationsInInterval_ = 0;
  std::unique_ptr<StragglerReporter> reporter_;
  // The logging rank's scalars, to each sink that is open.
  Status writeScalars(int64_t step, const std::map<std::string, double> &values);
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<MetricsFileWriter> metricsFile_;
};

}  // namespace loom
