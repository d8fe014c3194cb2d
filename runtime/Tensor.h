// Host tensors handed to and returned from programs.
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;    // float tensors (fp32 on the CPU backend)
  std::vector<int32_t> ints;  // integer tensors (tokens, labels)
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

}  // namespace loom
