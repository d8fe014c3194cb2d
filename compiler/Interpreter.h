// A reference interpreter for loom functions on the CPU kernels. It runs a function of any
// pass stage (global, tensor-parallel SPMD, differentiated, a pipeline chunk) on host
// tensors, with collectives from a Collectives implementation, so tests can check that every
// transformation computes what the unpartitioned program computes.
#pragma once

#include <cstdint>
#include <vector>

#include "llvm/Support/Error.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "runtime/Collectives.h"

namespace loom {

struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;      // float tensors
  std::vector<int32_t> ints;    // integer tensors (tokens, labels)
  bool isInt = false;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  static HostTensor zeros(std::vector<int64_t> shape) {
    HostTensor t{std::move(shape)};
    t.data.assign(t.numel(), 0.0f);
    return t;
  }
};

struct InterpreterOptions {
  uint64_t seed = 1234;             // dropout seed
  Collectives *collectives = nullptr;  // required when the function has collectives
};

llvm::Expected<std::vector<HostTensor>> interpret(mlir::func::FuncOp func,
                                                  const std::vector<HostTensor> &args,
                                                  const InterpreterOptions &options);

}  // namespace loom
