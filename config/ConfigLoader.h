// Loading and validating the text-format protobuf inputs: model configs and cluster specs.
// Errors are one line naming the file and, where known, line:col or the field.
#pragma once

#include <string>

#include "llvm/Support/Error.h"
#include "protos/cluster.pb.h"
#include "protos/model.pb.h"

namespace loom {

// Parses a text-format ModelConfig, fills Megatron's defaults for fields left at 0, and
// validates it (heads divide hidden, sizes positive, ...).
llvm::Expected<config::ModelConfig> loadModelConfig(const std::string &path);

// Parses a text-format DeviceFile (a device and its links: the simulator's model).
llvm::Expected<config::DeviceFile> loadDeviceFile(const std::string &path);

// Parses a text-format ClusterSpec (its device_file merged under its own fields), fills
// defaults and validates world size = t * p * d.
llvm::Expected<config::ClusterSpec> loadClusterSpec(const std::string &path);

// Fills a cluster spec's defaults in place and validates it (what loadClusterSpec does after
// parsing; `path` names it in errors).
llvm::Error finishClusterSpec(config::ClusterSpec &cluster, const std::string &path);

// Checks that a model can be split as the cluster's parallel request asks
// (t divides heads and ffn; p * v divides layers).
llvm::Error checkModelFitsCluster(const config::ModelConfig &model,
                                  const config::ClusterSpec &cluster,
                                  const std::string &clusterPath);

// Fills defaults in place (exposed for builders that receive a config from code).
void applyModelDefaults(config::ModelConfig &model);
llvm::Error validateModelConfig(const config::ModelConfig &model, const std::string &path);

// Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * t.
int64_t paddedVocabSize(const config::ModelConfig &model, int64_t tensorParallel);

}  // namespace loom
