"""An independent LLaMA in PyTorch: the oracle Loom's LLaMA-family training is checked against.

Written from Hugging Face's LlamaForCausalLM (modeling_llama.py) and its config.json, with its
parameter names and nn.Linear [out, in] layout: RMSNorm (x * rsqrt(mean(x^2) + eps) * weight),
rotary position embeddings in the rotate-half convention with float32 inv_freq =
1 / theta^(2i/d), grouped-query attention (repeat_kv), causal softmax attention, SwiGLU MLP
(down(silu(gate(x)) * up(x))), pre-norm residual blocks, final RMSNorm, lm_head (or the tied
embedding), mean cross-entropy over unmasked tokens. Nothing here imports or mirrors Loom's code.
"""
import math

import torch
import torch.nn.functional as F

from gpt_oracle import attention_rounding, rounding


class Llama:
    # precision "bf16" / "fp16": every op's output and every weight an op reads rounded to it
    # (gpt_oracle.rounding); bf16 attention rounds as FlashAttention does
    # (gpt_oracle.attention_rounding), the KV heads' gradients summed over their query heads in
    # fp32 (repeat_kv's gradient) before rounding.
    def __init__(self, weights, config, precision="fp32"):
        self.c, self.r = config, rounding(precision)
        self.attention_rounding = attention_rounding(precision)
        self.p = {k: v.clone().requires_grad_(True) for k, v in weights.items()}

    def parameters(self):
        return self.p

    def rms_norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"]) * w

    @staticmethod
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def logits(self, tokens):
        """The logits [B, S, vocab] of tokens [B, S]: embedding, the layers (attention, then
        self.mlp), final norm, output layer."""
        c, r = self.c, self.r
        rs, rp = self.attention_rounding
        p = {k: r(v) for k, v in self.p.items()}  # the weights the ops read
        H, KV, L = c["num_attention_heads"], c["num_key_value_heads"], c["num_hidden_layers"]
        B, S = tokens.shape
        x = r(p["model.embed_tokens.weight"][tokens.long()])
        hd = x.shape[-1] // H
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        freqs = torch.arange(S, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # [1, 1, S, hd]
        causal = torch.ones(S, S, dtype=torch.bool).tril()
        for i in range(L):
            pre = f"model.layers.{i}."
            h = r(self.rms_norm(x, p[pre + "input_layernorm.weight"]))
            q = r(h @ p[pre + "self_attn.q_proj.weight"].t()).view(B, S, H, hd).transpose(1, 2)
            k = r(h @ p[pre + "self_attn.k_proj.weight"].t()).view(B, S, KV, hd).transpose(1, 2)
            v = r(h @ p[pre + "self_attn.v_proj.weight"].t()).view(B, S, KV, hd).transpose(1, 2)
            q = r(q * cos + self.rotate_half(q) * sin)
            k = r(k * cos + self.rotate_half(k) * sin)
            k, v = (t.repeat_interleave(H // KV, dim=1) for t in (k, v))  # repeat_kv
            att = rs((q @ k.transpose(-1, -2)) / math.sqrt(hd))
            att = rp(att.masked_fill(~causal, float("-inf")).softmax(-1))
            y = r((att @ v).transpose(1, 2).reshape(B, S, H * hd))
            x = r(x + r(y @ p[pre + "self_attn.o_proj.weight"].t()))
            h = r(self.rms_norm(x, p[pre + "post_attention_layernorm.weight"]))
            x = r(x + self.mlp(p, pre, h))
        x = r(self.rms_norm(x, p["model.norm.weight"]))
        head = p["model.embed_tokens.weight"] if c["tie_word_embeddings"] else p["lm_head.weight"]
        return r(x @ head.t())

    def mlp(self, p, pre, h):
        """The SwiGLU MLP of the layer whose parameter names start with pre, on its normalised
        input h [B, S, hidden]: down(silu(gate(h)) * up(h)). p: the weights the ops read."""
        r = self.r
        gate, up = r(h @ p[pre + "mlp.gate_proj.weight"].t()), r(h @ p[pre + "mlp.up_proj.weight"].t())
        m = r(F.silu(gate) * up)
        return r(m @ p[pre + "mlp.down_proj.weight"].t())

    @staticmethod
    def cross_entropy(logits, labels, loss_mask):
        """The mean cross-entropy over the unmasked tokens."""
        per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), reduction="none")
        mask = loss_mask.reshape(-1)
        return (per_token * mask).sum() / mask.sum()

    def loss(self, tokens, labels, loss_mask):
        return self.cross_entropy(self.logits(tokens), labels, loss_mask)
