"""PyTorch's side of the GPU check (issue 7): trains the check's GPT (GPT-3 XL shape, about
1.3B parameters, seq 2048) on one GPU the way a PyTorch user would (bf16 autocast over fp32
master weights, fused AdamW, scaled_dot_product_attention's fused causal kernel) and prints
tokens/s and MFU against the bf16 GEMM rate measured in the same run.

FLOPs per step are PTD-P's count (bench/bench.py's flops_per_step), the same count Loom's
numbers use, so the two MFUs and their ratio compare like with like.

usage: python3 tools/gpu/torch_gpt_bench.py [--layers 24 --hidden 2048 --heads 16 --seq 2048
       --vocab 50304 --batch 4 --steps 6 --result FILE]   (--device cpu with a small shape checks the script)
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench import flops_per_step  # noqa: E402


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0: the fused (flash) kernel
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # Older PyTorch (Debian's, where this script's CPU check runs): the same math, unfused.
    s = q.shape[-2]
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return att.masked_fill(~causal, float("-inf")).softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, labels):
        x = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # output layer tied to the embedding
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def bf16_gemm_rate(device, n=8192, reps=10):
    """Measured bf16 GEMM FLOP/s: the mean of `reps` n^3 products after three warm-ups."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("layers", 24), ("hidden", 2048), ("heads", 16), ("seq", 2048), ("vocab", 50304),
                          ("batch", 4), ("steps", 6), ("gemm-size", 8192)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--result", help='write "tokens_per_s <n>" here (check.sh computes the Loom/PyTorch ratio)')
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_gpt_bench: no CUDA device visible to PyTorch (use --device cpu to check the script)")
    peak = bf16_gemm_rate(device, args.gemm_size)
    print(f"machine: {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}; "
          f"bf16 GEMM {args.gemm_size}^3: {peak / 1e12:.1f} TFLOP/s (measured)")

    torch.manual_seed(0)
    model = Gpt(args.layers, args.hidden, args.heads, args.seq, args.vocab).to(device)
    params = sum(p.numel() for p in model.parameters())
    fused = {"fused": True} if device.type == "cuda" else {}  # fused AdamW is CUDA-only (and newer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), **fused)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
    labels = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
    times, losses = [], []
    for _ in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(tokens, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if not all(math.isfinite(x) for x in losses):
        sys.exit(f"torch_gpt_bench: loss is not finite: {losses}")
    step = min(times[1:]) if len(times) > 1 else times[0]  # the first step warms up
    tokens_per_s = args.batch * args.seq / step
    flops = flops_per_step(args.layers, args.hidden, args.seq, args.vocab, args.batch) / step
    print(f"PyTorch GPT {params / 1e9:.2f}B params, seq {args.seq}, micro-batch {args.batch}: "
          f"{tokens_per_s:.0f} tokens/s, {flops / 1e12:.1f} TFLOP/s, MFU {100 * flops / peak:.1f}% of measured bf16 GEMM; "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    if args.result:
        with open(args.result, "w") as f:
            f.write(f"tokens_per_s {tokens_per_s}\n")


if __name__ == "__main__":
    main()
