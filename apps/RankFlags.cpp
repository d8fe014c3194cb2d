#include "apps/RankFlags.h"

namespace loom::rankflags {

namespace cl = llvm::cl;

namespace {
std::vector<std::string> &arguments() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

const std::vector<std::string> &forwardedArguments() { return arguments(); }

void recordArgument(llvm::StringRef name, llvm::StringRef value) {
  // A switch given without a value has no value (a null StringRef), unlike --name= (empty).
  arguments().push_back(value.data() ? ("--" + name + "=" + value).str() : ("--" + name).str());
}

cl::OptionCategory category("loom-rank options");

RankOpt<std::string> address("address", cl::desc("this rank's IP address, where its peers reach its Gloo pairs"),
                             cl::value_desc("IP"), cl::init("127.0.0.1"), cl::cat(category));
RankOpt<int64_t> threads("threads", cl::desc("OpenBLAS threads of this rank (loomrun: 1 per rank unless given)"),
                         cl::value_desc("T"), cl::cat(category));
RankOpt<int64_t> seed("seed", cl::desc("initialisation, dropout and sampling seed"), cl::value_desc("S"),
                      cl::init(1234), cl::cat(category));

RankOpt<std::string> dataPrefix("data-prefix",
                                cl::desc("an indexed dataset from loom-preprocess (PREFIX.bin/.idx); without it, "
                                         "synthetic tokens"),
                                cl::value_desc("PREFIX"), cl::cat(category));
RankOpt<double> validFraction("valid-fraction", cl::desc("the dataset's share held out for validation"),
                              cl::value_desc("F"), cl::init(0.05), cl::cat(category));
RankOpt<int64_t> evalInterval("eval-interval", cl::desc("validate every N iterations (0: never)"),
                              cl::value_desc("N"), cl::init(0), cl::cat(category));
RankOpt<int64_t> evalIters("eval-iters", cl::desc("validation batches per evaluation (at least 1)"),
                           cl::value_desc("K"), cl::init(1), cl::cat(category));

RankOpt<int64_t> steps("steps", cl::desc("training iterations"), cl::value_desc("N"), cl::init(1), cl::cat(category));
RankOpt<double> lr("lr", cl::desc("peak learning rate"), cl::value_desc("LR"), cl::init(3e-4), cl::cat(category));
RankOpt<double> minLr("min-lr", cl::desc("learning rate at the end of the decay (default: --lr / 10)"),
                      cl::value_desc("LR"), cl::cat(category));
RankOpt<int64_t> warmup("warmup", cl::desc("linear warm-up iterations"), cl::value_desc("N"), cl::init(0),
                        cl::cat(category));
RankOpt<int64_t> decayIters("decay-iters", cl::desc("cosine decay iterations (0: the whole run)"), cl::value_desc("N"),
                            cl::init(0), cl::cat(category));
RankOpt<double> clipGrad("clip-grad", cl::desc("gradient norm clipping threshold (0: no clipping)"),
                         cl::value_desc("C"), cl::init(1.0), cl::cat(category));
RankOpt<double> weightDecay("weight-decay", cl::desc("AdamW weight decay"), cl::value_desc("W"), cl::init(0.1),
                            cl::cat(category));
RankOpt<double> adamBeta1("adam-beta1", cl::desc("AdamW beta1"), cl::value_desc("B"), cl::init(0.9), cl::cat(category));
RankOpt<double> adamBeta2("adam-beta2", cl::desc("AdamW beta2"), cl::value_desc("B"), cl::init(0.95),
                          cl::cat(category));
RankOpt<double> adamEps("adam-eps", cl::desc("AdamW epsilon"), cl::value_desc("E"), cl::init(1e-8), cl::cat(category));
RankOpt<double> initialLossScale("initial-loss-scale",
                                 cl::desc("fp16's dynamic loss scaling starts here (Megatron's --initial-loss-scale)"),
                                 cl::value_desc("S"), cl::init(65536.0), cl::cat(category));
RankOpt<int64_t> logInterval("log-interval", cl::desc("print a log line every N iterations"), cl::value_desc("N"),
                             cl::init(1), cl::cat(category));

RankOpt<std::string> save("save", cl::desc("checkpoint directory"), cl::value_desc("DIR"), cl::cat(category));
RankOpt<int64_t> saveInterval("save-interval",
                              cl::desc("save a checkpoint every N iterations, and at the end (with --save)"),
                              cl::value_desc("N"), cl::init(0), cl::cat(category));
RankOpt<bool> asyncSave("async-save",
                        cl::desc("write checkpoints in the background (Megatron's --async-save): the rank copies its "
                                 "pieces to host memory and trains on while a thread writes them; one save in flight"),
                        cl::cat(category));
RankOpt<bool> resume("resume",
                     cl::desc("resume from the newest intact checkpoint in --save (a corrupt latest one is named "
                              "and skipped)"),
                     cl::cat(category));
RankOpt<bool> strictResume("strict-resume",
                           cl::desc("resume from the newest checkpoint in --save; a corrupt one stops the run"),
                           cl::cat(category));
RankOpt<std::string> initFrom("init-from", cl::desc("initial weights: a Hugging Face GPT-2, LLaMA, Mixtral or MegatronBERT safetensors file"),
                              cl::value_desc("HF.safetensors"), cl::cat(category));
RankOpt<std::string> exportPath("export",
                                cl::desc("export the trained weights as a Hugging Face checkpoint (config.json "
                                         "beside it)"),
                                cl::value_desc("MODEL.safetensors"), cl::cat(category));

RankOpt<std::string> device("device", cl::desc("cpu or cuda"), cl::value_desc("DEVICE"), cl::init("cpu"),
                            cl::cat(category));
RankOpt<std::string> precision("precision",
                               cl::desc("the CUDA backend's GEMM operands for an fp32 plan: fp32, bf16 or fp16 "
                                        "(default: bf16 on cuda, fp32 on cpu; a bf16 plan is compiled as one)"),
                               cl::value_desc("P"), cl::cat(category));
RankOpt<int64_t> gpu("gpu", cl::desc("the GPU to use with --device cuda (default: the rank modulo the GPU count)"),
                     cl::value_desc("N"), cl::cat(category));
RankOpt<std::string> attention("attention", cl::desc("attention kernel with --device cuda: auto, unfused or flash"),
                               cl::value_desc("KERNEL"), cl::init("auto"), cl::cat(category));

RankOpt<std::string> tensorboardDir("tensorboard-dir",
                                    cl::desc("write TensorBoard event files (Megatron's scalar names)"),
                                    cl::value_desc("DIR"), cl::cat(category));
RankOpt<std::string> metricsFile("metrics-file", cl::desc("write the same metrics as JSON lines"),
                                 cl::value_desc("FILE.jsonl"), cl::cat(category));

RankOpt<std::string> dumpGrads("dump-grads", cl::desc("write each rank's gradients of the first step (tests)"),
                               cl::value_desc("DIR"), cl::cat(category));
RankOpt<std::string> dumpBatches("dump-batches",
                                 cl::desc("write every training micro-batch's inputs (the oracle reads them)"),
                                 cl::value_desc("DIR"), cl::cat(category));
RankOpt<std::string> dumpRouting("dump-routing",
                                 cl::desc("write every training step's MoE routing choices and kept assignments (the oracle reads them)"),
                                 cl::value_desc("DIR"), cl::cat(category));
RankOpt<std::string> lossLog("loss-log", cl::desc("write \"iteration loss\" lines, full precision (tests)"),
                             cl::value_desc("FILE"), cl::cat(category));
RankOpt<std::string> trace("trace",
                           cl::desc("write DIR/rank_N.json: a Chrome trace of every executed instruction"),
                           cl::value_desc("DIR"), cl::cat(category));
RankOpt<double> connectTimeout("connect-timeout", cl::desc("seconds to keep trying to reach the coordinator"),
                               cl::value_desc("S"), cl::init(20), cl::cat(category));
RankOpt<double> commTimeout("comm-timeout", cl::desc("seconds a collective may wait for its peers"),
                            cl::value_desc("S"), cl::init(30), cl::cat(category));

}  // namespace loom::rankflags
