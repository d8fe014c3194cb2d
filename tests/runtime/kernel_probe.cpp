// Runs one CPU kernel (forward and backward) on the tensors of a safetensors file and writes
// the results to another, so tests/runtime/kernels_vs_torch.py can compare them with
// PyTorch. usage: kernel_probe IN.safetensors OUT.safetensors  (metadata "op" selects it)
#include <cstdio>
#include <string>

#include "runtime/cpu/Optimizer.h"
#include "formats/Safetensors.h"
#include "runtime/cpu/Kernels.h"

using loom::HostTensor;

namespace {

HostTensor like(const HostTensor &t) { return HostTensor::zeros(t.shape); }
int64_t last(const HostTensor &t) { return t.shape.back(); }

}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: kernel_probe IN.safetensors OUT.safetensors\n");
    return 2;
  }
  loom::SafetensorsFile in, out;
  if (loom::Status s = loom::readSafetensors(argv[1], &in); !s.isOk()) {
    std::fprintf(stderr, "kernel_probe: error: %s\n", s.message().c_str());
    return 1;
  }
  auto &T = in.tensors;
  auto meta = [&](const char *k) { return std::stod(in.metadata.at(k)); };
  std::string op = in.metadata["op"];
  auto &O = out.tensors;
  if (op == "linear") {
    bool tw = meta("transpose") != 0;
    HostTensor &x = T["x"], &w = T["w"], &b = T["b"], &g = T["g"];
    int64_t k = last(x), n = last(g), m = x.numel() / k;
    O["y"] = like(g), O["dx"] = like(x), O["dw"] = like(w), O["db"] = like(b);
    loom::cpu::linearForward(x.data.data(), w.data.data(), b.data.data(), O["y"].data.data(), m, k, n, tw);
    loom::cpu::linearForward(g.data.data(), w.data.data(), nullptr, O["dx"].data.data(), m, n, k, !tw);
    loom::cpu::linearWeightGrad(x.data.data(), g.data.data(), O["dw"].data.data(), m, k, n, tw);
    loom::cpu::biasGrad(g.data.data(), O["db"].data.data(), m, n);
  } else if (op == "layer_norm") {
    HostTensor &x = T["x"], &gamma = T["gamma"], &beta = T["beta"], &g = T["g"];
    int64_t n = last(x), rows = x.numel() / n;
    O["y"] = like(x), O["dx"] = like(x), O["dgamma"] = like(gamma), O["dbeta"] = like(beta);
    loom::cpu::layerNormForward(x.data.data(), gamma.data.data(), beta.data.data(), O["y"].data.data(), rows, n,
                                float(meta("eps")));
    loom::cpu::layerNormBackward(x.data.data(), gamma.data.data(), g.data.data(), O["dx"].data.data(),
                                 O["dgamma"].data.data(), O["dbeta"].data.data(), rows, n, float(meta("eps")));
  } else if (op == "gelu") {
    HostTensor &x = T["x"], &g = T["g"];
    O["y"] = like(x), O["dx"] = like(x);
    loom::cpu::geluForward(x.data.data(), O["y"].data.data(), x.numel());
    loom::cpu::geluBackward(x.data.data(), g.data.data(), O["dx"].data.data(), x.numel());
  } else if (op == "attention") {
    HostTensor &qkv = T["qkv"], &g = T["g"];
    const float *mask = T.count("key_mask") ? T["key_mask"].data.data() : nullptr;
    int64_t heads = int64_t(meta("heads"));
    loom::cpu::AttentionShape s{qkv.shape[0], qkv.shape[1], heads, qkv.shape[2] / (3 * heads), meta("causal") != 0,
                                0.0f, 0, 0};
    O["y"] = like(g), O["dqkv"] = like(qkv), O["lse"] = HostTensor::zeros({s.batch, heads, s.seq});
    std::vector<float> scratch(size_t(loom::cpu::attentionScratchFloats(s.seq, true)));
    loom::cpu::attentionForward(qkv.data.data(), mask, O["y"].data.data(), O["lse"].data.data(), s, scratch.data());
    loom::cpu::attentionBackward(qkv.data.data(), mask, g.data.data(), O["lse"].data.data(), O["dqkv"].data.data(), s,
                                 scratch.data());
  } else if (op == "rms_norm") {
    HostTensor &x = T["x"], &gamma = T["gamma"], &g = T["g"];
    int64_t n = last(x), rows = x.numel() / n;
    O["y"] = like(x), O["dx"] = like(x), O["dgamma"] = like(gamma);
    loom::cpu::rmsNormForward(x.data.data(), gamma.data.data(), O["y"].data.data(), rows, n, float(meta("eps")));
    loom::cpu::rmsNormBackward(x.data.data(), gamma.data.data(), g.data.data(), O["dx"].data.data(),
                               O["dgamma"].data.data(), rows, n, float(meta("eps")));
  } else if (op == "rotary") {
    HostTensor &x = T["x"], &g = T["g"];
    int64_t hd = int64_t(meta("head_dim"));
    O["y"] = like(x), O["dx"] = like(x);
    loom::cpu::rotary(x.data.data(), O["y"].data.data(), x.shape[0], x.shape[1], x.shape[2] / hd, hd,
                      float(meta("theta")), false);
    loom::cpu::rotary(g.data.data(), O["dx"].data.data(), x.shape[0], x.shape[1], x.shape[2] / hd, hd,
                      float(meta("theta")), true);
  } else if (op == "swiglu") {
    HostTensor &gate = T["gate"], &up = T["up"], &g = T["g"];
    O["y"] = like(gate), O["dgate"] = like(gate), O["dup"] = like(up);
    loom::cpu::swigluForward(gate.data.data(), up.data.data(), O["y"].data.data(), gate.numel());
    loom::cpu::swigluBackward(gate.data.data(), up.data.data(), g.data.data(), O["dgate"].data.data(),
                              O["dup"].data.data(), gate.numel());
  } else if (op == "grouped_attention") {
    HostTensor &q = T["q"], &k = T["k"], &v = T["v"], &g = T["g"];
    int64_t heads = int64_t(meta("heads")), kvHeads = int64_t(meta("kv_heads"));
    loom::cpu::GroupedAttentionShape s{q.shape[0], q.shape[1], heads, kvHeads, q.shape[2] / heads, 0,
                                       heads / kvHeads, meta("causal") != 0, 0.0f, 0, 0};
    O["y"] = like(q), O["dq"] = like(q), O["dk"] = like(k), O["dv"] = like(v);
    O["lse"] = HostTensor::zeros({s.batch, heads, s.seq});
    std::vector<float> scratch(size_t(loom::cpu::attentionScratchFloats(s.seq, true)));
    loom::cpu::groupedAttentionForward(q.data.data(), k.data.data(), v.data.data(), O["y"].data.data(),
                                       O["lse"].data.data(), s, scratch.data());
    loom::cpu::groupedAttentionBackward(q.data.data(), k.data.data(), v.data.data(), g.data.data(),
                                        O["lse"].data.data(), O["dq"].data.data(), O["dk"].data.data(),
                                        O["dv"].data.data(), s, scratch.data());
  } else if (op == "embedding") {
    HostTensor &tok = T["tokens"], &word = T["word"], &pos = T["position"], &g = T["g"];
    int64_t hidden = word.shape[1];
    O["y"] = like(g), O["dword"] = like(word), O["dposition"] = like(pos);
    loom::cpu::embeddingForward(tok.ints.data(), word.data.data(), pos.data.data(), O["y"].data.data(), tok.numel(),
                                tok.shape[1], hidden, 0, word.shape[0]);
    loom::cpu::embeddingBackward(tok.ints.data(), g.data.data(), O["dword"].data.data(), tok.numel(), hidden, 0,
                                 word.shape[0]);
    loom::cpu::positionBackward(g.data.data(), O["dposition"].data.data(), g.shape[0], g.shape[1], hidden,
                                pos.shape[0]);
  } else if (op == "cross_entropy") {
    HostTensor &logits = T["logits"], &labels = T["labels"], &mask = T["mask"];
    int64_t cols = last(logits), tokens = logits.numel() / cols, valid = int64_t(meta("valid_vocab"));
    std::vector<float> mx(tokens), sum(tokens), target(tokens);
    loom::cpu::crossEntropyLocalMax(logits.data.data(), mx.data(), tokens, cols, 0, valid);
    loom::cpu::crossEntropyLocalSums(logits.data.data(), labels.ints.data(), mx.data(), sum.data(), target.data(),
                                     tokens, cols, 0, valid);
    O["loss"] = HostTensor::zeros({});
    O["loss"].data = {loom::cpu::crossEntropyLoss(mx.data(), sum.data(), target.data(), mask.data.data(), tokens)};
    O["lse"] = HostTensor::zeros({labels.shape[0], labels.shape[1]});
    loom::cpu::crossEntropyLogSumExp(mx.data(), sum.data(), O["lse"].data.data(), tokens);
    O["dlogits"] = like(logits);
    loom::cpu::crossEntropyBackward(logits.data.data(), labels.ints.data(), mask.data.data(), O["lse"].data.data(),
                                    float(meta("grad")), O["dlogits"].data.data(), tokens, cols, 0, valid);
  } else if (op == "adamw") {
    // The optimizer program's kernel over one decayed segment (the whole tensor).
    HostTensor p = T["param"];
    int64_t n = p.numel();
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    std::vector<loom::planattr::FlatSegment> segments = {{0, n, true, false, true}};
    for (int step = 1; step <= int(meta("steps")); ++step) {
      loom::cpu::AdamWHyper h{1.0f, float(meta("lr")), float(step), float(meta("weight_decay")), float(meta("beta1")),
                              float(meta("beta2")), float(meta("eps"))};
      loom::cpu::adamwFlat(p.data.data(), T["grad" + std::to_string(step)].data.data(), m.data(), v.data(),
                           p.data.data(), segments, {0, n}, h);
    }
    O["param"] = p;
  } else {
    std::fprintf(stderr, "kernel_probe: error: unknown op '%s'\n", op.c_str());
    return 1;
  }
  if (loom::Status s = loom::writeSafetensors(argv[2], out); !s.isOk()) {
    std::fprintf(stderr, "kernel_probe: error: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}
