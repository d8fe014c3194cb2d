// loom-rank's training flags (data, recipe, checkpoints, device, metrics, tests), as llvm::cl
// options shared by loom-rank and loomrun. loomrun links them too: it accepts them on its own
// command line, refuses a malformed one before it starts anything, lists them in its --help,
// and passes to every loom-rank the arguments that set them, as they were given
// (forwardedArguments()). The flags that say which job and rank a process is (--coordinator,
// --rank, --token, --tls-*) are loom-rank's alone (apps/loom_rank.cpp): loomrun sets those.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llvm/Support/CommandLine.h"

namespace loom::rankflags {

// The arguments that set options declared with RankOpt, in command-line order, each as one
// "--name=value" (a switch given without a value as "--name").
const std::vector<std::string> &forwardedArguments();
void recordArgument(llvm::StringRef name, llvm::StringRef value);

// A cl::opt that also records each occurrence, raw, for forwardedArguments().
template <class T>
class RankOpt : public llvm::cl::opt<T> {
 public:
  using llvm::cl::opt<T>::opt;
  bool addOccurrence(unsigned pos, llvm::StringRef name, llvm::StringRef value, bool multiArg = false) override {
    recordArgument(name, value);
    return llvm::cl::opt<T>::addOccurrence(pos, name, value, multiArg);
  }
};

// "loom-rank options": loom-rank's --help lists these and its job flags; loomrun's lists them
// after its own.
extern llvm::cl::OptionCategory category;

// The job's defaults where the option is not given: loom-rank's semantics (--min-lr defaults
// to --lr / 10, --precision to bf16 on CUDA and fp32 on the CPU, --gpu to the rank's turn
// among the machine's GPUs) read getNumOccurrences().
extern RankOpt<std::string> address;
extern RankOpt<int64_t> threads, seed;
// data
extern RankOpt<std::string> dataPrefix;
extern RankOpt<double> validFraction;
extern RankOpt<int64_t> evalInterval, evalIters;
// recipe
extern RankOpt<int64_t> steps, warmup, decayIters, logInterval;
extern RankOpt<double> lr, minLr, clipGrad, weightDecay, adamBeta1, adamBeta2, adamEps, initialLossScale;
// checkpoints
extern RankOpt<std::string> save, initFrom, exportPath;
extern RankOpt<int64_t> saveInterval;
extern RankOpt<bool> resume, strictResume, asyncSave;
// device
extern RankOpt<std::string> device, precision, attention;
extern RankOpt<int64_t> gpu;
// metrics
extern RankOpt<std::string> tensorboardDir, metricsFile;
// tests
extern RankOpt<std::string> dumpGrads, dumpBatches, dumpRouting, lossLog, trace;
extern RankOpt<double> connectTimeout, commTimeout;

}  // namespace loom::rankflags
