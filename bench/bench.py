"""Training throughput of Loom against this machine's limit and against PyTorch.

For each model (gpt-tiny, GPT-2 small): Loom trains on one rank with T BLAS threads
(`loomrun --nproc 1 --threads T`, synthetic tokens), and PyTorch (Debian's python3-torch, the
same thread count) trains the same model (the oracle's independent GPT-2 with AdamW) on the
same batch shape, in the same run. Printed: tokens/s, model FLOP/s (6 N + attention per token,
the PTD-P count without recomputation), MFU against the measured OpenBLAS sgemm peak, and the
ratio Loom / PyTorch. A benchmark, not a test: numbers vary with the machine.

usage: bench.py --bin DIR --examples DIR --sgemm-peak BIN [--threads 2] [--steps 3]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
from gpt_oracle import Gpt2  # noqa: E402

MODELS = {  # name: (layers, hidden, heads, seq, vocab, micro-batch)
    "gpt-tiny": (4, 64, 4, 32, 1000, 8),
    "gpt2-small": (12, 768, 12, 1024, 50257, 1),
}


def flops_per_step(layers, hidden, seq, vocab, batch):
    # PTD-P section 5.1 without recomputation: 72 B s l h^2 (1 + s / 6h + V / 12 l h)
    return 72 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


def loom_tokens_per_second(args, name, cfg, work):
    layers, hidden, heads, seq, vocab, batch = cfg
    model = os.path.join(work, name + ".pbtxt")
    with open(model, "w") as f:
        f.write(f'name: "{name}"\narchitecture: GPT\nnum_layers: {layers}\nhidden_size: {hidden}\n'
                f"num_attention_heads: {heads}\nseq_length: {seq}\nvocab_size: {vocab}\n")
    cluster = os.path.join(work, "one.pbtxt")
    with open(cluster, "w") as f:
        f.write(f'name: "one"\nnodes: 1\ndevices_per_node: 1\ndevice {{ kind: CPU }}\n'
                f"parallel {{ micro_batch_size: {batch} global_batch_size: {batch} }}\n")
    plans = os.path.join(work, "plans-" + name)
    subprocess.run([os.path.join(args.bin, "loomc"), "compile", model, "--cluster", cluster, "--out", plans, "--quiet"],
                   check=True)
    out = subprocess.run([os.path.join(args.bin, "loomrun"), "--nproc", "1", "--plans", plans, "--threads",
                          str(args.threads), "--steps", str(args.steps)], check=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True).stdout
    times = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", out)]
    step = min(times[1:]) / 1000 if len(times) > 1 else times[0] / 1000  # the first step warms up
    return batch * seq / step


def torch_tokens_per_second(args, cfg):
    layers, hidden, heads, seq, vocab, batch = cfg
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    w = {"transformer.wte.weight": torch.randn(vocab, hidden) * 0.02,
         "transformer.wpe.weight": torch.randn(seq, hidden) * 0.02,
         "transformer.ln_f.weight": torch.ones(hidden), "transformer.ln_f.bias": torch.zeros(hidden)}
    for i in range(layers):
        p = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            w[p + ln + ".weight"], w[p + ln + ".bias"] = torch.ones(hidden), torch.zeros(hidden)
        for name, (i_, o) in {"attn.c_attn": (hidden, 3 * hidden), "attn.c_proj": (hidden, hidden),
                              "mlp.c_fc": (hidden, 4 * hidden), "mlp.c_proj": (4 * hidden, hidden)}.items():
            w[p + name + ".weight"], w[p + name + ".bias"] = torch.randn(i_, o) * 0.02, torch.zeros(o)
    model = Gpt2(w, layers, heads)
    opt = torch.optim.AdamW(list(model.parameters().values()), lr=1e-4, betas=(0.9, 0.95))
    tokens = torch.randint(0, vocab, (batch, seq))
    labels = torch.randint(0, vocab, (batch, seq))
    mask = torch.ones(batch, seq)
    best = float("inf")
    for _ in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        model.loss(tokens, labels, mask).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters().values()), 1.0)
        opt.step()
        best = min(best, time.perf_counter() - t0)
    return batch * seq / best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--sgemm-peak", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--models", default="gpt-tiny,gpt2-small")
    args = ap.parse_args()
    peak = float(subprocess.run([args.sgemm_peak, "--threads", str(args.threads)], check=True,
                                stdout=subprocess.PIPE, text=True).stdout) * 1e9
    print(f"machine: OpenBLAS sgemm peak with {args.threads} threads: {peak / 1e9:.1f} GFLOP/s")
    print(f"{'model':12} {'system':8} {'tokens/s':>10} {'GFLOP/s':>9} {'MFU':>6}")
    with tempfile.TemporaryDirectory() as work:
        for name in args.models.split(","):
            cfg = MODELS[name]
            per_token = flops_per_step(cfg[0], cfg[1], cfg[3], cfg[4], 1) / cfg[3]
            loom = loom_tokens_per_second(args, name, cfg, work)
            pt = torch_tokens_per_second(args, cfg)
            for system, tps in (("Loom", loom), ("PyTorch", pt)):
                print(f"{name:12} {system:8} {tps:10.0f} {tps * per_token / 1e9:9.1f} {100 * tps * per_token / peak:5.1f}%")
            print(f"{name:12} Loom / PyTorch = {loom / pt:.2f}", flush=True)


if __name__ == "__main__":
    main()
