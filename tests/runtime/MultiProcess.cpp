#include "tests/runtime/MultiProcess.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "formats/Safetensors.h"

namespace loom::test {

std::string runfile(const std::string &path) {
  const char *dir = std::getenv("TEST_SRCDIR");
  const char *ws = std::getenv("TEST_WORKSPACE");
  return std::string(dir ? dir : ".") + "/" + (ws ? ws : "loom") + "/" + path;
}

Result run(const std::string &command) {
  Result r;
  auto start = std::chrono::steady_clock::now();
  FILE *p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  int status = pclose(p);
  r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

JobGradients readJobGradients(const std::string &dir, int worldSize) {
  JobGradients out;
  struct Replicas {
    HostTensor sum;  // over `count` replicas
    int count = 0;
  };
  std::map<std::string, std::map<int, Replicas>> shards, copies;  // name -> shard index -> replicas
  std::map<std::string, int> shardDim;
  bool haveLoss = false;
  for (int r = 0; r < worldSize; ++r) {
    SafetensorsFile f;
    Status s = readSafetensors(dir + "/grads_rank" + std::to_string(r) + ".safetensors", &f);
    if (!s.isOk()) return out.error = s.message(), out;
    if (f.metadata.count("__loss__")) {
      double l = std::stod(f.metadata["__loss__"]);
      if (haveLoss && std::abs(l - out.loss) > 1e-6 * std::abs(l))
        return out.error = "ranks disagree on the loss", out;
      out.loss = l, haveLoss = true;
    }
    // Taken before the optimizer program: with ZeRO-1 each data-parallel replica holds its own
    // gradients (averaged here), and a pipeline-tied copy holds its stage's part (summed into
    // its twin's here); other replicas (data parallel, tensor-parallel replicated) must agree.
    bool dpSynchronized = f.metadata["__dp_synchronized__"] != "false";
    for (auto &[name, t] : f.tensors) {
      int dim, parts, index;
      std::sscanf(f.metadata[name].c_str(), "%d,%d,%d", &dim, &parts, &index);
      bool copy = f.metadata.count("tied:" + name) > 0;
      std::string base = copy ? f.metadata["tied:" + name] : name;
      shardDim[base] = dim;
      Replicas &slot = (copy ? copies : shards)[base][dim < 0 ? 0 : index];
      if (slot.count > 0 && dpSynchronized) {
        for (size_t i = 0; i < t.data.size(); ++i)
          if (std::abs(slot.sum.data[i] / slot.count - t.data[i]) > 1e-6 * (1 + std::abs(t.data[i])))
            return out.error = "replicas of '" + name + "' disagree", out;
        continue;
      }
      if (slot.count == 0)
        slot.sum = std::move(t);
      else
        for (size_t i = 0; i < t.data.size(); ++i) slot.sum.data[i] += t.data[i];
      ++slot.count;
    }
  }
  if (!haveLoss) return out.error = "no rank reported the loss", out;
  for (auto &[name, replicas] : shards) {
    std::map<int, HostTensor> parts;  // the step's gradient per shard: mean of replicas, plus the copy's
    for (auto &[index, r] : replicas) {
      HostTensor g = r.sum;
      for (float &x : g.data) x /= float(r.count);
      auto copy = copies[name].find(index);
      if (copy != copies[name].end())
        for (size_t i = 0; i < g.data.size(); ++i) g.data[i] += copy->second.sum.data[i] / float(copy->second.count);
      parts[index] = std::move(g);
    }
    int dim = shardDim[name];
    if (dim < 0) {
      out.grads[name] = parts.begin()->second;
      continue;
    }
    std::vector<int64_t> shape = parts.begin()->second.shape;
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < int(shape.size()); ++k)
      if (k < dim) outer *= shape[k];
      else if (k > dim) inner *= shape[k];
    int64_t block = shape[dim] * inner, n = int64_t(parts.size());
    shape[dim] *= n;
    HostTensor full = HostTensor::zeros(shape);
    for (auto &[p, t] : parts)
      for (int64_t a = 0; a < outer; ++a)
        std::memcpy(&full.data[(a * n + p) * block], &t.data[a * block], block * sizeof(float));
    out.grads[name] = std::move(full);
  }
  return out;
}

}  // namespace loom::test
