"""Loom's CPU kernels against PyTorch: forward and backward of each op, and AdamW.

PyTorch (Debian's python3-torch) computes every op here with its own implementation and
autograd; kernel_probe runs Loom's kernels on the same inputs. fp32, relative error < 1e-5.
usage: /usr/bin/python3 kernels_vs_torch.py KERNEL_PROBE WORKDIR
"""
import json
import os
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F

PROBE, WORK = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
failures = []


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": {k: str(v) for k, v in metadata.items()}}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        dtype = "I32" if t.dtype in (torch.int32, torch.int64) else "F32"
        data = t.to(torch.int32 if dtype == "I32" else torch.float32).numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(info["shape"])
    return out


def probe(op, tensors, **meta):
    path_in, path_out = os.path.join(WORK, op + ".in"), os.path.join(WORK, op + ".out")
    write_safetensors(path_in, tensors, dict(op=op, **meta))
    subprocess.run([PROBE, path_in, path_out], check=True)
    return read_safetensors(path_out)


def check(what, got, want, tol=1e-5):
    err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    status = "ok" if err < tol else "FAIL"
    print(f"{status:4} {what:32} relative error {err:.2e}")
    if err >= tol:
        failures.append(what)


def grads(out, g, inputs):
    return torch.autograd.grad(out, inputs, g)


# linear, both weight layouts
for transpose in (0, 1):
    x = torch.randn(2, 5, 16, requires_grad=True)
    w = torch.randn(24, 16, requires_grad=True) if transpose else torch.randn(16, 24, requires_grad=True)
    b = torch.randn(24, requires_grad=True)
    y = x @ (w.t() if transpose else w) + b
    g = torch.randn_like(y)
    dx, dw, db = grads(y, g, (x, w, b))
    r = probe("linear", dict(x=x, w=w, b=b, g=g), transpose=transpose)
    for k, want in dict(y=y, dx=dx, dw=dw, db=db).items():
        check(f"linear[transpose={transpose}].{k}", r[k], want)

# layer norm
x = torch.randn(3, 7, 32, requires_grad=True)
gamma = torch.randn(32, requires_grad=True)
beta = torch.randn(32, requires_grad=True)
y = F.layer_norm(x, (32,), gamma, beta, 1e-5)
g = torch.randn_like(y)
r = probe("layer_norm", dict(x=x, gamma=gamma, beta=beta, g=g), eps=1e-5)
for k, want in zip(("y", "dx", "dgamma", "dbeta"), (y, *grads(y, g, (x, gamma, beta)))):
    check(f"layer_norm.{k}", r[k], want)

# GeLU (tanh approximation, as GPT-2)
x = torch.randn(4, 50, requires_grad=True) * 3
x.retain_grad()
y = F.gelu(x, approximate="tanh")
g = torch.randn_like(y)
r = probe("gelu", dict(x=x, g=g))
check("gelu.y", r["y"], y)
check("gelu.dx", r["dx"], grads(y, g, (x,))[0])

# RMS norm, as Hugging Face's LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * weight
x = torch.randn(3, 7, 32, requires_grad=True)
gamma = torch.randn(32, requires_grad=True)
y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma
g = torch.randn_like(y)
r = probe("rms_norm", dict(x=x, gamma=gamma, g=g), eps=1e-5)
for k, want in zip(("y", "dx", "dgamma"), (y, *grads(y, g, (x, gamma)))):
    check(f"rms_norm.{k}", r[k], want)

# rotary embedding, as Hugging Face's LlamaRotaryEmbedding + apply_rotary_pos_emb (rotate_half)
B, S, H, D, theta = 2, 11, 3, 8, 10000.0
x = torch.randn(B, S, H * D, requires_grad=True)
inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
freqs = torch.outer(torch.arange(S, dtype=torch.float64), inv_freq)
emb = torch.cat((freqs, freqs), dim=-1)
cos, sin = emb.cos().float()[None, :, None, :], emb.sin().float()[None, :, None, :]
xh = x.view(B, S, H, D)
rotate_half = torch.cat((-xh[..., D // 2:], xh[..., : D // 2]), dim=-1)
y = (xh * cos + rotate_half * sin).reshape(B, S, H * D)
g = torch.randn_like(y)
r = probe("rotary", dict(x=x, g=g), head_dim=D, theta=theta)
check("rotary.y", r["y"], y)
check("rotary.dx", r["dx"], grads(y, g, (x,))[0])

# SwiGLU: silu(gate) * up
gate = torch.randn(4, 50, requires_grad=True)
up = torch.randn(4, 50, requires_grad=True)
y = F.silu(gate) * up
g = torch.randn_like(y)
r = probe("swiglu", dict(gate=gate, up=up, g=g))
for k, want in zip(("y", "dgate", "dup"), (y, *grads(y, g, (gate, up)))):
    check(f"swiglu.{k}", r[k], want)

# grouped-query attention: KV heads repeated for their query heads (Hugging Face's repeat_kv);
# S = 150: several 64-query blocks, the last one partial (the causal blocking's edges)
for causal, kv_heads, S in ((1, 2, 9), (0, 1, 9), (1, 4, 9), (1, 2, 150), (0, 2, 150)):
    B, H, D = 2, 4, 8
    q = torch.randn(B, S, H * D, requires_grad=True)
    k = torch.randn(B, S, kv_heads * D, requires_grad=True)
    v = torch.randn(B, S, kv_heads * D, requires_grad=True)
    qh = q.view(B, S, H, D).transpose(1, 2)
    kh = k.view(B, S, kv_heads, D).transpose(1, 2).repeat_interleave(H // kv_heads, dim=1)
    vh = v.view(B, S, kv_heads, D).transpose(1, 2).repeat_interleave(H // kv_heads, dim=1)
    scores = qh @ kh.transpose(-1, -2) / D**0.5
    if causal:
        scores = scores.masked_fill(torch.ones(S, S).triu(1).bool(), float("-inf"))
    y = (scores.softmax(-1) @ vh).transpose(1, 2).reshape(B, S, H * D)
    g = torch.randn_like(y)
    r = probe("grouped_attention", dict(q=q, k=k, v=v, g=g), heads=H, kv_heads=kv_heads, causal=causal)
    for name, want in zip(("y", "dq", "dk", "dv"), (y, *grads(y, g, (q, k, v)))):
        check(f"grouped_attention[kv={kv_heads},causal={causal},S={S}].{name}", r[name], want)
    # the softmax statistics the forward keeps for the backward: each row's log-sum-exp
    check(f"grouped_attention[kv={kv_heads},causal={causal},S={S}].lse", r["lse"], scores.logsumexp(-1))

# attention core: qkv laid out [heads, 3, head_dim] per token
for causal, masked, S in ((1, False, 9), (0, True, 9), (1, False, 150), (1, True, 150), (0, True, 150)):
    B, H, D = 2, 3, 8
    qkv = torch.randn(B, S, 3 * H * D, requires_grad=True)
    q, k, v = qkv.view(B, S, H, 3, D).permute(3, 0, 2, 1, 4)  # each [B, H, S, D]
    scores = q @ k.transpose(-1, -2) / D**0.5
    key_mask = (torch.rand(B, S) > 0.3).float()
    key_mask[:, 0] = 1
    if causal:
        scores = scores.masked_fill(torch.ones(S, S).triu(1).bool(), float("-inf"))
    if masked:
        scores = scores.masked_fill(key_mask[:, None, None, :] == 0, float("-inf"))
    y = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(B, S, H * D)
    g = torch.randn_like(y)
    tensors = dict(qkv=qkv, g=g)
    if masked:
        tensors["key_mask"] = key_mask
    r = probe("attention", tensors, heads=H, causal=causal)
    check(f"attention[causal={causal},masked={masked},S={S}].y", r["y"], y)
    check(f"attention[causal={causal},masked={masked},S={S}].dqkv", r["dqkv"], grads(y, g, (qkv,))[0])
    check(f"attention[causal={causal},masked={masked},S={S}].lse", r["lse"], scores.logsumexp(-1))

# token + position embedding
word = torch.randn(50, 16, requires_grad=True)
pos = torch.randn(12, 16, requires_grad=True)
tokens = torch.randint(0, 50, (3, 10))
y = F.embedding(tokens, word) + pos[:10]
g = torch.randn_like(y)
r = probe("embedding", dict(tokens=tokens, word=word, position=pos, g=g))
check("embedding.y", r["y"], y)
dword, dpos = grads(y, g, (word, pos))
check("embedding.dword", r["dword"], dword)
check("embedding.dposition", r["dposition"], dpos)

# cross-entropy over a padded vocabulary (padding columns excluded) with a loss mask
logits = torch.randn(2, 6, 40, requires_grad=True)
labels = torch.randint(0, 37, (2, 6))
mask = (torch.rand(2, 6) > 0.25).float()
logp = F.log_softmax(logits[..., :37], -1)
nll = -logp.gather(-1, labels[..., None])[..., 0]
loss = (nll * mask).sum() / mask.sum()
r = probe("cross_entropy", dict(logits=logits, labels=labels, mask=mask), valid_vocab=37, grad=0.5)
check("cross_entropy.loss", r["loss"], loss.reshape([]))
check("cross_entropy.lse", r["lse"], torch.logsumexp(logits[..., :37], -1))
check("cross_entropy.dlogits", r["dlogits"], torch.autograd.grad(loss * 0.5, logits)[0])

# AdamW against torch.optim.AdamW, three steps
p = torch.randn(10, 7)
gs = [torch.randn(10, 7) for _ in range(3)]
ref = p.clone().requires_grad_(True)
opt = torch.optim.AdamW([ref], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
for gstep in gs:
    ref.grad = gstep.clone()
    opt.step()
r = probe("adamw", dict(param=p, grad1=gs[0], grad2=gs[1], grad3=gs[2]), lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8,
          weight_decay=0.1, steps=3)
check("adamw.param after 3 steps", r["param"], ref.detach())

print(f"{len(failures)} failures" if failures else "all kernels match PyTorch")
sys.exit(1 if failures else 0)
