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


def _round_through(dtype, doc):
    """An autograd function: fp32 -> dtype -> fp32 in the forward pass and the same on the
    gradient in the backward."""

    class Round(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.to(dtype).to(x.dtype)

        @staticmethod
        def backward(ctx, g):
            return g.to(dtype).to(g.dtype)

    Round.__doc__ = doc
    return Round


# Mixed precision's rounding points (Micikevicius et al. 2018) in an fp32 model. Placed after
# each op and on each weight the op reads, the model computes in fp32 between 16-bit values,
# with fp32 master weights and gradients accumulated in fp32 (what Megatron's bf16 / fp16
# training does, written here from the recipe, not from Loom). With fp16 the gradients rounded
# are those of the loss times the loss scale (the caller scales the loss and unscales the
# gradients), as in mixed precision with loss scaling.
Bf16Round = _round_through(torch.bfloat16, "Rounds values and gradients through bf16.")
Fp16Round = _round_through(torch.float16, "Rounds values and gradients through fp16.")


class Bf16RoundValue(torch.autograd.Function):
    """Rounds the value only (its gradient passes as it is): attention's probabilities, which
    FlashAttention rounds to bf16 for the product with V (Dao 2023, FlashAttention-2, section
    3.1) while the gradient dP stays fp32."""

    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g


class Bf16RoundGradient(torch.autograd.Function):
    """Rounds the gradient only: attention's scores, whose gradient dS FlashAttention rounds to
    bf16 for the products with K and Q while the scores themselves stay fp32."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).to(g.dtype)


def rounding(precision):
    """The rounding after each op for "fp32" (none), "bf16" or "fp16" (a bool: bf16 or not)."""
    precision = {True: "bf16", False: "fp32"}.get(precision, precision)
    return {"bf16": Bf16Round.apply, "fp16": Fp16Round.apply}.get(precision, lambda x: x)


def attention_rounding(precision):
    """(scores, probabilities) roundings inside attention: FlashAttention's points in bf16 (the
    CPU backend's bf16 attention rounds there); none in fp32 and fp16 (its fp16 attention
    computes in fp32 between fp16 inputs and output)."""
    if {True: "bf16", False: "fp32"}.get(precision, precision) != "bf16":
        return (lambda x: x), (lambda x: x)
    return Bf16RoundGradient.apply, Bf16RoundValue.apply


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
    # precision "bf16" / "fp16" (or True for bf16): every op's output and every weight an op
    # reads rounded to it (Bf16Round / Fp16Round); the softmax, the norms' statistics and the
    # loss stay fp32 inside their ops; bf16 attention rounds as FlashAttention does (the
    # probabilities for P V, the scores' gradient for dQ and dK).
    def __init__(self, weights, layers, heads, precision="fp32"):
        self.layers, self.heads, self.r = layers, heads, rounding(precision)
        self.attention_rounding = attention_rounding(precision)
        self.p = {k: v.clone().requires_grad_(True) for k, v in weights.items()}

    def parameters(self):
        return self.p

    def loss(self, tokens, labels, loss_mask):
        r, H = self.r, self.heads
        rs, rp = self.attention_rounding
        p = {k: r(v) for k, v in self.p.items()}  # the weights the ops read
        B, S = tokens.shape
        x = r(p["transformer.wte.weight"][tokens.long()] + p["transformer.wpe.weight"][:S])
        causal = torch.ones(S, S, dtype=torch.bool).tril()
        for i in range(self.layers):
            pre = f"transformer.h.{i}."
            h = r(F.layer_norm(x, x.shape[-1:], p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], 1e-5))
            qkv = r(h @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"])
            q, k, v = qkv.split(x.shape[-1], dim=-1)
            q, k, v = (t.view(B, S, H, -1).transpose(1, 2) for t in (q, k, v))
            att = rs((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]))
            att = rp(att.masked_fill(~causal, float("-inf")).softmax(-1))
            y = r((att @ v).transpose(1, 2).reshape(B, S, -1))
            x = r(x + r(y @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]))
            h = r(F.layer_norm(x, x.shape[-1:], p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], 1e-5))
            m = r(F.gelu(r(h @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"]), approximate="tanh"))
            x = r(x + r(m @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]))
        x = r(F.layer_norm(x, x.shape[-1:], p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5))
        logits = r(x @ p["transformer.wte.weight"].t())
        nll = F.cross_entropy(logits.reshape(B * S, -1), labels.reshape(-1).long(), reduction="none")
        mask = loss_mask.reshape(-1)
        return (nll * mask).sum() / mask.sum()
