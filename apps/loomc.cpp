// loomc: Loom's compiler driver.
//   loomc build CONFIG [--micro-batch N] [-o OUT.mlir]
//       Emit Transformer IR for a model config (protos/model.proto, text format): global
//       shapes, the tokenizer's vocabulary, a dynamic batch unless --micro-batch is given.
//   loomc verify FILE.mlir [-o OUT.mlir] [--split-input-file] [--verify-diagnostics]
//       Parse and verify IR, print it back in canonical form.
//   loomc compile MODEL --cluster SPEC --out DIR [--mlir-print-ir-after-all]
//       MODEL is Transformer IR (FILE.mlir, or - for stdin) or a model config (FILE.pbtxt,
//       built first as by `loomc build`). Runs the pass pipeline, lowers to one plan per rank
//       plus a summary.
//   loomc check DIR
//       Prove the plans of DIR run together (no deadlock, matched collectives and messages).
//   loomc simulate DIR [--json] [--timeline FILE.svg] [--device FILE] [--precision fp32|bf16] [--unit-cost]
//       Replay one step of every rank's plan on the cluster's device and link model: the
//       predicted step time, TFLOP/s per device, MFU, bubble, exposed communication, memory.
//   loomc search MODEL --cluster SPEC [--top K] [--json] [--evaluate N] [--html FILE.html]
//       Rank the parallel configurations of the cluster's devices for the model by predicted
//       throughput (the plans compiled in memory and simulated; no files written).
//   loomc calibrate --out FILE [--threads N] [--repeats N]
//       Measure this machine's CPU kernels and Gloo loopback collectives into a device file.
//   loomc opt FILE.mlir --loom-tensor-parallel=tp=2 --loom-autodiff ... [--mlir-print-ir-after-all]
//       Run passes one by one (MLIR's opt driver: pass options, IR after each pass).
#include "analysis/Calibrate.h"
#include "compiler/Compile.h"
#include "analysis/PlanCheck.h"
#include "analysis/PlanViews.h"
#include "analysis/PlanExplorer.h"
#include "analysis/Search.h"
#include "analysis/TraceCheck.h"
#include "analysis/StepSimulator.h"
#include "config/ConfigLoader.h"
#include "compiler/ModelBuilder.h"
#include "compiler/ToolSupport.h"
#include "google/protobuf/text_format.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/ToolUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "passes/Passes.h"
#include "runtime/BackendMemory.h"
#include "support/CommandLine.h"
#include "ir/LoomDialect.h"

namespace cl = llvm::cl;

namespace {

cl::OptionCategory loomCategory("loomc options");

cl::SubCommand buildCmd("build", "Emit Transformer IR for a model config");
cl::opt<std::string> buildConfig(cl::Positional, cl::Required, cl::desc("<model config .pbtxt>"),
                                 cl::sub(buildCmd), cl::cat(loomCategory));
cl::opt<int64_t> buildMicroBatch("micro-batch", cl::desc("static batch dimension of train_step (default: the config's micro_batch_size, else dynamic)"),
                                 cl::init(0), cl::sub(buildCmd), cl::cat(loomCategory));
cl::opt<std::string> buildOut("o", cl::desc("output file (default stdout)"), cl::init("-"),
                              cl::sub(buildCmd), cl::cat(loomCategory));

cl::SubCommand compileCmd("compile", "Compile a model for a cluster into per-rank plans");
cl::opt<std::string> compileModel(cl::Positional, cl::Required, cl::desc("<model: IR .mlir, - (IR on stdin) or config .pbtxt>"),
                                   cl::sub(compileCmd), cl::cat(loomCategory));
cl::opt<std::string> compileCluster("cluster", cl::Required, cl::desc("cluster spec .pbtxt"), cl::sub(compileCmd),
                                    cl::cat(loomCategory));
cl::opt<std::string> compileOut("out", cl::Required, cl::desc("output directory for the plans"), cl::sub(compileCmd),
                                cl::cat(loomCategory));
cl::opt<bool> compileIrAfterAll("mlir-print-ir-after-all", cl::desc("print the IR after each pass (stderr)"),
                                cl::sub(compileCmd), cl::cat(loomCategory));
cl::opt<bool> compileQuiet("quiet", cl::desc("no summary on stdout"), cl::sub(compileCmd), cl::cat(loomCategory));

cl::SubCommand checkCmd("check", "Prove a plan directory's ranks can run their step together (no deadlock, "
                                  "matched collectives and messages)");
cl::opt<std::string> checkDir(cl::Positional, cl::Required, cl::desc("<plan directory>"), cl::sub(checkCmd),
                              cl::cat(loomCategory));
cl::opt<std::string> checkTrace("trace",
                                cl::desc("also check the traces in this folder (loom-rank --trace: rank_R.json) "
                                         "against the plans: each stream ran the plan's instructions in its order, "
                                         "every event respected"),
                                cl::value_desc("dir"), cl::sub(checkCmd), cl::cat(loomCategory));

cl::SubCommand simulateCmd("simulate", "Predict a plan directory's step time, throughput, bubble, communication and "
                                        "memory on its cluster's device and link model");
cl::opt<std::string> simulateDir(cl::Positional, cl::Required, cl::desc("<plan directory>"), cl::sub(simulateCmd),
                                 cl::cat(loomCategory));
cl::opt<bool> simulateJson("json", cl::desc("print one JSON object"), cl::sub(simulateCmd), cl::cat(loomCategory));
cl::opt<std::string> simulateTimeline("timeline", cl::desc("write the predicted step as SVG (ranks as rows)"),
                                      cl::sub(simulateCmd), cl::cat(loomCategory));
cl::opt<std::string> simulateDevice("device", cl::desc("a device file (DeviceFile text proto, e.g. from loomc "
                                                       "calibrate) instead of the plans' device and links"),
                                    cl::sub(simulateCmd), cl::cat(loomCategory));
cl::opt<std::string> simulatePrecision("precision", cl::desc("GEMM operands: fp32 or bf16 (default: bf16 on CUDA "
                                                             "devices, fp32 on CPUs, as loom-rank runs them)"),
                                       cl::sub(simulateCmd), cl::cat(loomCategory));
cl::opt<bool> simulateUnitCost("unit-cost", cl::desc("each forward program run costs 1, each backward 2, the rest "
                                                     "nothing (the schedule's analytic bubble)"),
                               cl::sub(simulateCmd), cl::cat(loomCategory));

cl::SubCommand searchCmd("search", "Rank the parallel configurations (t, p, d, v, b, recompute, sequence parallel, "
                                    "ZeRO-1, schedule) of a cluster for a model by predicted throughput");
cl::opt<std::string> searchModel(cl::Positional, cl::Required, cl::desc("<model config .pbtxt>"), cl::sub(searchCmd),
                                 cl::cat(loomCategory));
cl::opt<std::string> searchCluster("cluster", cl::Required, cl::desc("cluster spec .pbtxt (its devices and global "
                                                                     "batch; its parallel sizes are ignored)"),
                                   cl::sub(searchCmd), cl::cat(loomCategory));
cl::opt<int> searchTop("top", cl::desc("configurations to print (default 5)"), cl::init(5), cl::sub(searchCmd),
                       cl::cat(loomCategory));
cl::opt<int> searchEvaluate("evaluate", cl::desc("candidates compiled and simulated, the estimate's best (default 32)"),
                            cl::init(32), cl::sub(searchCmd), cl::cat(loomCategory));
cl::opt<bool> searchJsonOut("json", cl::desc("print a JSON list"), cl::sub(searchCmd), cl::cat(loomCategory));
cl::opt<std::string> searchHtml("html",
                                cl::desc("also write the candidates as a page: a sortable table and a scatter of "
                                         "throughput against memory"),
                                cl::value_desc("FILE.html"), cl::sub(searchCmd), cl::cat(loomCategory));

cl::SubCommand calibrateCmd("calibrate", "Measure this machine's CPU kernels and Gloo loopback collectives into a "
                                          "device file (for loomc simulate --device)");
cl::opt<std::string> calibrateOut("out", cl::desc("the device file to write"), cl::sub(calibrateCmd),
                                  cl::cat(loomCategory));
cl::opt<int> calibrateThreads("threads", cl::desc("BLAS threads per rank, as loom-rank --threads (default 1)"),
                              cl::init(1), cl::sub(calibrateCmd), cl::cat(loomCategory));
cl::opt<int> calibrateRepeats("repeats", cl::desc("timed runs of each program (default 5)"), cl::init(5),
                              cl::sub(calibrateCmd), cl::cat(loomCategory));
cl::opt<int> glooWorker("gloo-worker", cl::desc("(internal) run one Gloo measurement worker"), cl::init(-1),
                        cl::Hidden, cl::sub(calibrateCmd), cl::cat(loomCategory));
cl::opt<std::string> glooDir("gloo-dir", cl::desc("(internal) the Gloo workers' file store"), cl::Hidden,
                             cl::sub(calibrateCmd), cl::cat(loomCategory));

cl::SubCommand verifyCmd("verify", "Parse and verify IR, print it back");
cl::opt<std::string> verifyInput(cl::Positional, cl::Required, cl::desc("<input .mlir or ->"),
                                 cl::sub(verifyCmd), cl::cat(loomCategory));
cl::opt<std::string> verifyOut("o", cl::desc("output file (default stdout)"), cl::init("-"),
                               cl::sub(verifyCmd), cl::cat(loomCategory));
cl::opt<bool> splitInput("split-input-file", cl::desc("treat '// -----' as separate inputs"),
                         cl::sub(verifyCmd), cl::cat(loomCategory));
cl::opt<bool> verifyDiagnostics("verify-diagnostics",
                                cl::desc("check diagnostics against expected-* comments"),
                                cl::sub(verifyCmd), cl::cat(loomCategory));
cl::opt<bool> printDebugInfo("mlir-print-debuginfo", cl::desc("print locations"),
                             cl::sub(verifyCmd), cl::sub(buildCmd), cl::cat(loomCategory));

mlir::OpPrintingFlags printingFlags() {
  mlir::OpPrintingFlags flags;
  if (printDebugInfo) flags.enableDebugInfo();
  return flags;
}

int runBuild() {
  llvm::Expected<loom::config::ModelConfig> model = loom::loadModelConfig(buildConfig);
  if (!model) return loom::reportError("loomc", model.takeError());
  if (buildMicroBatch < 0)
    return loom::reportError("loomc", llvm::createStringError(llvm::inconvertibleErrorCode(),
                                                              "--micro-batch must be >= 1"));
  loom::BuildOptions options;
  options.microBatch = buildMicroBatch;
  mlir::MLIRContext ctx;
  loom::OneLineDiagnostics diags(ctx);
  mlir::OwningOpRef<mlir::ModuleOp> module = loom::buildModel(ctx, *model, options);
  if (failed(mlir::verify(*module))) return 1;  // a builder bug: the verifier said which op
  if (llvm::Error e = loom::writeOutput(buildOut, [&](llvm::raw_ostream &os) {
        module->print(os, printingFlags());
        os << "\n";
      }))
    return loom::reportError("loomc", std::move(e));
  return 0;
}

// Compile options with the runtime's memory model of the backends (what they allocate beyond
// the plan's buffers): the compiler plans it without including a runtime header.
loom::CompileOptions compileOptions(const std::string &outDir, bool quiet, const std::string &modelName = "") {
  loom::CompileOptions options{outDir, false, quiet, modelName};
  options.backendMemory = loom::backendReserve;
  return options;
}

int runCompile() {
  llvm::Expected<loom::config::ClusterSpec> cluster = loom::loadClusterSpec(compileCluster);
  if (!cluster) return loom::reportError("loomc", cluster.takeError());
  loom::CompileOptions options = compileOptions(compileOut, compileQuiet);
  options.printIrAfterAll = compileIrAfterAll;
  options.progress = true;  // drawn only on a terminal
  llvm::StringRef path = compileModel;
  if (path.ends_with(".pbtxt")) {  // a config: built into IR, then the same compile
    llvm::Expected<loom::config::ModelConfig> model = loom::loadModelConfig(compileModel);
    if (!model) return loom::reportError("loomc", model.takeError());
    if (llvm::Error e = loom::checkModelFitsCluster(*model, *cluster, compileCluster))
      return loom::reportError("loomc", std::move(e));
    if (llvm::Error e = loom::compile(*model, *cluster, options, llvm::outs()))
      return loom::reportError("loomc", std::move(e));
    return 0;
  }
  mlir::MLIRContext ctx;
  loom::registerLoomDialects(ctx);
  loom::OneLineDiagnostics diags(ctx);
  mlir::OwningOpRef<mlir::ModuleOp> module = loom::readModule(ctx, compileModel);
  if (!module) return 1;  // the parser or verifier said where
  options.modelName = path == "-" ? "model" : llvm::sys::path::stem(path).str();
  if (llvm::Error e = loom::compile(*module, *cluster, options, llvm::outs()))
    return loom::reportError("loomc", std::move(e));
  return 0;
}

int runVerify() {
  mlir::MLIRContext ctx;
  loom::registerLoomDialects(ctx);
  loom::OneLineDiagnostics diags(ctx);
  std::string err;
  auto input = mlir::openInputFile(verifyInput, &err);
  if (!input) {
    llvm::errs() << verifyInput << ": error: cannot open file: " << err << "\n";
    return 1;
  }
  std::string printed;
  llvm::raw_string_ostream out(printed);
  auto processChunk = [&](std::unique_ptr<llvm::MemoryBuffer> chunk, llvm::raw_ostream &os) {
    llvm::SourceMgr sm;
    sm.AddNewSourceBuffer(std::move(chunk), llvm::SMLoc());
    if (verifyDiagnostics) {
      mlir::SourceMgrDiagnosticVerifierHandler handler(sm, &ctx);
      mlir::OwningOpRef<mlir::ModuleOp> m = mlir::parseSourceFile<mlir::ModuleOp>(sm, &ctx);
      if (m) m->print(os, printingFlags());
      return handler.verify();
    }
    mlir::OwningOpRef<mlir::ModuleOp> m = mlir::parseSourceFile<mlir::ModuleOp>(sm, &ctx);
    if (!m) return mlir::failure();
    m->print(os, printingFlags());
    os << "\n";
    return mlir::success();
  };
  mlir::LogicalResult result =
      splitInput ? mlir::splitAndProcessBuffer(std::move(input), processChunk, out,
                                               mlir::kDefaultSplitMarker, mlir::kDefaultSplitMarker)
                 : processChunk(std::move(input), out);
  if (failed(result)) return 1;
  if (llvm::Error e = loom::writeOutput(verifyOut, [&](llvm::raw_ostream &os) { os << printed; }))
    return loom::reportError("loomc", std::move(e));
  return 0;
}

int runCheck() {
  llvm::Expected<loom::PlanDirectory> plans = loom::readPlanDirectory(checkDir);
  if (!plans) return loom::reportError("loomc", plans.takeError());
  std::vector<loom::RankPrograms> ranks = loom::rankPrograms(*plans);
  loom::CheckResult summary;
  if (llvm::Error e = loom::checkPlans(ranks, &summary))
    return loom::reportError("loomc", llvm::createStringError(llvm::inconvertibleErrorCode(),
                                                              checkDir + ": " + llvm::toString(std::move(e))));
  llvm::outs() << checkDir << ": " << summary.summary << "\n";
  if (!checkTrace.empty()) {
    std::string traced;
    if (llvm::Error e = loom::checkTraces(ranks, checkTrace, &traced)) return loom::reportError("loomc", std::move(e));
    llvm::outs() << checkTrace << ": " << traced << "\n";
  }
  return 0;
}

int runSimulate() {
  auto fail = [](const std::string &msg) {
    return loom::reportError("loomc", llvm::createStringError(llvm::inconvertibleErrorCode(), msg));
  };
  llvm::Expected<loom::PlanDirectory> plans = loom::readPlanDirectory(simulateDir);
  if (!plans) return loom::reportError("loomc", plans.takeError());
  std::vector<loom::RankPrograms> ranks = loom::rankPrograms(*plans);
  loom::SimulateOptions options;
  options.unitCost = simulateUnitCost;
  options.precision = loom::defaultPrecision(plans->ranks[0]);
  if (simulatePrecision == "bf16")
    options.precision = loom::GemmPrecision::kBf16;
  else if (simulatePrecision == "fp32")
    options.precision = loom::GemmPrecision::kFp32;
  else if (!simulatePrecision.empty())
    return fail("--precision: expected fp32 or bf16, got '" + simulatePrecision + "'");
  loom::config::DeviceFile device;
  if (!simulateDevice.empty()) {
    llvm::Expected<loom::config::DeviceFile> d = loom::loadDeviceFile(simulateDevice);
    if (!d) return loom::reportError("loomc", d.takeError());
    device = *d;
    options.device = &device;
  }
  loom::StepPrediction prediction;
  if (llvm::Error e = loom::simulateStep(ranks, options, &prediction)) return fail(simulateDir + ": " + llvm::toString(std::move(e)));
  if (!simulateTimeline.empty())
    if (llvm::Error e = loom::writeOutput(simulateTimeline, [&](llvm::raw_ostream &os) {
          os << loom::predictionTimelineSvg(ranks, prediction);
        }))
      return loom::reportError("loomc", std::move(e));
  llvm::outs() << (simulateJson ? loom::predictionJson(prediction) : loom::predictionText(prediction));
  return 0;
}

int runSearch() {
  llvm::Expected<loom::config::ClusterSpec> cluster = loom::loadClusterSpec(searchCluster);
  if (!cluster) return loom::reportError("loomc", cluster.takeError());
  llvm::Expected<loom::config::ModelConfig> model = loom::loadModelConfig(searchModel);
  if (!model) return loom::reportError("loomc", model.takeError());
  if (searchTop < 1 || searchEvaluate < 1)
    return loom::reportError("loomc", llvm::createStringError(llvm::inconvertibleErrorCode(),
                                                              "search: --top and --evaluate must be >= 1"));
  loom::SearchOptions options;
  options.top = searchTop, options.evaluate = searchEvaluate, options.clusterPath = searchCluster;
  options.progress = true;  // drawn only on a terminal
  options.compile = [](const loom::config::ModelConfig &m, const loom::config::ClusterSpec &c,
                       loom::CompiledPlans *plans) -> llvm::Error {
    mlir::MLIRContext ctx;
    ctx.disableMultithreading();  // the search runs candidates on its own threads
    loom::OneLineDiagnostics diags(ctx);
    mlir::OwningOpRef<mlir::ModuleOp> module = loom::buildModel(ctx, m, {});
    return loom::compileInMemory(*module, c, compileOptions("", true, m.name()), plans);
  };
  loom::SearchResult result;
  if (llvm::Error e = loom::searchConfigurations(*model, *cluster, options, &result))
    return loom::reportError("loomc", std::move(e));
  llvm::outs() << (searchJsonOut ? loom::searchJson(result, searchTop) : loom::searchText(result, *cluster, searchTop));
  if (!searchHtml.empty()) {
    std::string page = loom::searchExplorerHtml(loom::searchJson(result, searchTop),
                                                "Loom search: " + model->name() + " on " + cluster->name());
    if (llvm::Error e = loom::writeOutput(searchHtml, [&](llvm::raw_ostream &os) { os << page; }))
      return loom::reportError("loomc", std::move(e));
  }
  return 0;
}

int runCalibrate(const char *argv0) {
  if (glooWorker >= 0) return loom::runGlooWorker(glooWorker, glooDir);
  auto fail = [](const std::string &msg) {
    return loom::reportError("loomc", llvm::createStringError(llvm::inconvertibleErrorCode(), msg));
  };
  if (calibrateOut.empty()) return fail("calibrate: --out FILE is required");
  if (calibrateThreads < 1 || calibrateRepeats < 1) return fail("calibrate: --threads and --repeats must be >= 1");
  llvm::SmallString<128> work;
  if (std::error_code ec = llvm::sys::fs::createUniqueDirectory("loom-calibrate", work))
    return fail("calibrate: cannot make a scratch directory: " + ec.message());
  llvm::SmallString<256> self;
  if (std::error_code ec = llvm::sys::fs::real_path("/proc/self/exe", self)) self = argv0;
  loom::CalibrateOptions options{calibrateThreads, calibrateRepeats, std::string(self), std::string(work)};
  options.compile = [](const loom::config::ModelConfig &model, const loom::config::ClusterSpec &cluster,
                       const std::string &dir) {
    std::string summary;
    llvm::raw_string_ostream os(summary);
    return loom::compile(model, cluster, compileOptions(dir, true, model.name()), os);
  };
  loom::config::DeviceFile device;
  llvm::Error e = loom::calibrate(options, &device, llvm::errs());
  llvm::sys::fs::remove_directories(work);
  if (e) return loom::reportError("loomc", std::move(e));
  std::string text;
  google::protobuf::TextFormat::PrintToString(device, &text);
  if (llvm::Error w = loom::writeOutput(calibrateOut, [&](llvm::raw_ostream &os) {
        os << "# This machine's device file, measured by `loomc calibrate --threads " << calibrateThreads
           << "` (kernels of compiled calibration models on the CPU executor; Gloo all-reduces over loopback).\n"
           << text;
      }))
    return loom::reportError("loomc", std::move(w));
  llvm::errs() << "wrote " << calibrateOut << "\n";
  return 0;
}

}  // namespace

int runOpt(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<loom::LoomDialect, mlir::func::FuncDialect>();
  loom::registerLoomPasses();
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "Loom pass driver (loomc opt)\n", registry));
}

int main(int argc, char **argv) {
  if (argc > 1 && llvm::StringRef(argv[1]) == "opt") return runOpt(argc - 1, argv + 1);
  if (!loom::parseCommandLine(argc, argv, "Loom compiler\n", {&loomCategory})) return 2;
  if (buildCmd) return runBuild();
  if (verifyCmd) return runVerify();
  if (compileCmd) return runCompile();
  if (checkCmd) return runCheck();
  if (simulateCmd) return runSimulate();
  if (calibrateCmd) return runCalibrate(argv[0]);
  if (searchCmd) return runSearch();
  llvm::errs() << "loomc: error: expected a subcommand: build, compile, check, simulate, search, calibrate, verify, opt (see loomc --help)\n";
  return 1;
}
