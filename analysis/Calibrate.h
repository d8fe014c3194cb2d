// `loomc calibrate`: measures this machine's CPU kernels and Gloo's loopback collectives into
// a device file (protos/cluster.proto DeviceFile) for `loomc simulate --device`.
//
// Kernels: small GPT and LLaMA models of growing size are compiled for one rank (and two, for
// the tensor-parallel ops and shapes); each rank's schedule runs step after step on the CPU
// executor with its trace on, and every executed instruction is a sample (op, FLOPs, bytes,
// seconds). GEMMs (linear, weight_grad) and attention give the efficiency curves against the
// best GEMM rate seen (the device's fp32 peak here); every other op gets a fitted rate:
// seconds = overhead + bytes / rate (least squares over its samples).
// Contention: one calibration model's training step alone against one copy per core at once
// gives the all-cores-busy slowdown (the simulator's processor sharing uses it; the two-rank
// samples are scaled back to a kernel alone by it).
// Communication: two worker processes (this binary again) connect through Gloo over loopback
// with a file store and run all-reduces of growing size as the executor issues them (on the TP
// stream's thread after a GEMM on the compute stream); the cost per call gives the intra-node
// link's measured step times (a ring over two ranks: two steps of half the bytes).
#pragma once

#include <functional>
#include <string>

#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include "protos/cluster.pb.h"
#include "protos/model.pb.h"

namespace loom {

struct CalibrateOptions {
  int threads = 1;       // BLAS threads per rank, as loom-rank --threads
  int repeats = 3;       // timed runs of each program (after one warm-up)
  std::string self;      // this executable, for the Gloo workers
  std::string workDir;   // scratch space (plans, the workers' store)
  // Compiles a model for a cluster into a plan directory (loomc's compile).
  std::function<llvm::Error(const config::ModelConfig &, const config::ClusterSpec &, const std::string &dir)> compile;
};

llvm::Error calibrate(const CalibrateOptions &options, config::DeviceFile *out, llvm::raw_ostream &log);

// One Gloo worker of the communication measurement (rank 0 or 1): rank 0 writes
// "bytes seconds" lines to DIR/allreduce.txt.
int runGlooWorker(int rank, const std::string &dir);

}  // namespace loom
