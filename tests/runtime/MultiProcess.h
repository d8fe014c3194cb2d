// Helpers for tests that run Loom's binaries as real processes.
#pragma once

#include <map>
#include <string>

#include "runtime/Tensor.h"

namespace loom::test {

// Path of a binary or data file in the test's runfiles.
std::string runfile(const std::string &path);

struct Result {
  int exitCode = -1;
  std::string output;  // stdout and stderr
  double seconds = 0;
};
// Runs a shell command, capturing its output.
Result run(const std::string &command);

// Gradients of a whole job, assembled from the ranks' --dump-grads files: tensor-parallel
// shards concatenated, pipeline-tied copies and data-parallel replicas checked to agree.
struct JobGradients {
  double loss = 0;
  std::map<std::string, HostTensor> grads;
  std::string error;
};
JobGradients readJobGradients(const std::string &dir, int worldSize);

}  // namespace loom::test
