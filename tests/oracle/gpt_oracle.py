"""An independent GPT-2 in PyTorch: the oracle Loom's parallel training is checked against.

Written from the GPT-2 architecture (Radford et al. 2019) with Hugging Face's parameter names
and Conv1D layout ([in, out] weights; c_attn columns ordered q, k, v, each split into heads):
pre-LN blocks, learned positions, causal self-attention, tanh-GeLU MLP of width 4h, final
layer norm, output layer tied to the word embedding, mean cross-entropy over unmasked tokens.
Nothing here imports or mirrors Loom's code; it only reads Loom's files (safetensors weights
and batches) and writes nothing.
"""
import json
import math
import struct

import torch
import torch.nn.functional as F


def read_safetensors(path):
    """Tensors and metadata of a safetensors file (F32 / I32)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        dtype = {"F32": torch.float32, "I32": torch.int32}[info["dtype"]]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=dtype).reshape(info["shape"]).clone()
    return out, meta


class Gpt2:
    def __init__(self, weights, layers, heads):
        self.layers, self.heads = layers, heads
        self.p = {k: v.clone().requires_grad_(True) for k, v in weights.items()}

    def parameters(self):
        return self.p

    def loss(self, tokens, labels, loss_mask):
        p, H = self.p, self.heads
        B, S = tokens.shape
        x = p["transformer.wte.weight"][tokens.long()] + p["transformer.wpe.weight"][:S]
        causal = torch.ones(S, S, dtype=torch.bool).tril()
        for i in range(self.layers):
            pre = f"transformer.h.{i}."
            h = F.layer_norm(x, x.shape[-1:], p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], 1e-5)
            qkv = h @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
            q, k, v = qkv.split(x.shape[-1], dim=-1)
            q, k, v = (t.view(B, S, H, -1).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            att = att.masked_fill(~causal, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(B, S, -1)
            x = x + y @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
            h = F.layer_norm(x, x.shape[-1:], p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], 1e-5)
            m = F.gelu(h @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"], approximate="tanh")
            x = x + m @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
        x = F.layer_norm(x, x.shape[-1:], p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5)
        logits = x @ p["transformer.wte.weight"].t()
        nll = F.cross_entropy(logits.reshape(B * S, -1), labels.reshape(-1).long(), reduction="none")
        mask = loss_mask.reshape(-1)
        return (nll * mask).sum() / mask.sum()
