#include "data/DataSource.h"

#include "runtime/cpu/Philox.h"

namespace loom {

std::vector<int32_t> SyntheticData::sample(int64_t index) {
  std::vector<int32_t> tokens(seq_ + 1);
  for (int64_t i = 0; i <= seq_; ++i) {
    auto r = cpu::philox4x32({uint32_t(i), uint32_t(index), uint32_t(uint64_t(index) >> 32), 0x5eed},
                             {uint32_t(seed_), uint32_t(seed_ >> 32)});
    tokens[i] = int32_t(r[0] % uint32_t(vocab_));
  }
  return tokens;
}

std::map<std::string, HostTensor> DataSource::batch(int64_t first, int64_t count, int64_t seq) {
  HostTensor tokens{{count, seq}}, labels{{count, seq}};
  tokens.isInt = labels.isInt = true;
  for (int64_t b = 0; b < count; ++b) {
    std::vector<int32_t> s = sample(first + b);
    tokens.ints.insert(tokens.ints.end(), s.begin(), s.begin() + seq);
    labels.ints.insert(labels.ints.end(), s.begin() + 1, s.begin() + seq + 1);
  }
  HostTensor ones{{count, seq}};
  ones.data.assign(count * seq, 1.0f);
  return {{"tokens", tokens}, {"labels", labels}, {"loss_mask", ones}, {"attention_mask", ones}};
}

}  // namespace loom
