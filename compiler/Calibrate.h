// `loomc calibrate`: measures this machine's CPU kernels and Gloo's loopback collectives into
// a device file (protos/cluster.proto DeviceFile) for `loomc simulate --device`.
//
// Kernels: small GPT and LLaMA models of growing size are compiled for one rank and each of
// their programs runs on the CPU executor with its trace on; every executed instruction is a
// sample (op, FLOPs, bytes, seconds). GEMMs (linear, weight_grad) and attention give the
// efficiency curves against the best GEMM rate seen (the device's fp32 peak here); every other
// op gets a fitted rate: seconds = overhead + bytes / rate (least squares over its samples).
// Communication: two worker processes (this binary again) connect through Gloo over loopback
// with a file store and time all-reduces of growing size; the fit t = 2 latency + bytes / bw
// (the ring over two ranks) gives the intra-node link.
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
