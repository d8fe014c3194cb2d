"""An independent BERT in PyTorch: the oracle Loom's BERT training is checked against.

Written from the pre-LN BERT of the Megatron-LM paper (Shoeybi et al. 2019, figure 7) in Hugging
Face's MegatronBertForPreTraining layout (modeling_megatron_bert.py: its parameter names,
nn.Linear [out, in] weights y = x W^T + b) and its config.json; Megatron-LM's pretrain_bert
objective (masked LM plus the binary sentence-order head). Nothing here imports or mirrors
Loom's code; it reads Loom's files (safetensors weights and batches) and writes nothing.

- embeddings: word[tokens] + position[0..s-1] + token_type[token_types]; no layer norm there
  (Megatron-BERT normalises at the start of each layer instead), dropout 0.
- each layer (bert.encoder.layer.{l}.):
    h = LN(x; attention.ln); q, k, v = attention.self.query/key/value(h), each split into heads;
    scores = q k^T / sqrt(head_dim), the keys whose attention_mask is 0 at probability exactly 0
    (-inf before the softmax; every row keeps [CLS]); x = x + attention.output.dense(softmax v);
    h = LN(x; ln); x = x + output.dense(gelu_new(intermediate.dense(h))).
  gelu_new is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
- x = LN(x; bert.encoder.ln).
- masked LM: t = LN(gelu_new(cls.predictions.transform.dense(x)); transform.LayerNorm);
  logits = t word_embeddings^T + cls.predictions.bias (decoder tied to the word embeddings);
  mlm = sum(loss_mask * CE) / sum(loss_mask).
- sentence order: pooled = tanh(bert.pooler.dense(x[:, 0])); sop_logits =
  cls.seq_relationship(pooled); sop = the sop_mask-weighted mean over samples of CE(sop_logits,
  sop_labels[:, 0]) (sop_mask: 1 at each sample's position 0, 0 elsewhere).
- loss = mlm + sop. LayerNorm eps: config.json's layer_norm_eps.

precision "bf16" / "fp16": mixed precision's rounding points (gpt_oracle.rounding, the recipe of
Micikevicius et al. 2018): every op's output and every weight an op reads rounded to 16 bits, each
op computing in fp32 between them (the embedding sum of words and positions is one op, the
segments' addition another; a linear's bias is added before its rounding); the softmax, the
norms' statistics and both losses in fp32; bf16 attention rounds where FlashAttention does
(gpt_oracle.attention_rounding), the padded keys' probabilities exactly 0.

loom_grads_to_hf maps Loom's gradient dump
(its own names and [in, out] layouts, fused per-head QKV, padded vocabulary) to these names.
"""
import math
import re

import torch
import torch.nn.functional as F

from gpt_oracle import attention_rounding, rounding


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def hf_shapes(config):
    """Every parameter of MegatronBertForPreTraining this oracle trains, name -> shape (the tied
    decoder weight is the word embedding: not a parameter of its own)."""
    V, H, F_ = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    P, T = config["max_position_embeddings"], config.get("type_vocab_size", 2)
    s = {"bert.embeddings.word_embeddings.weight": (V, H),
         "bert.embeddings.position_embeddings.weight": (P, H),
         "bert.embeddings.token_type_embeddings.weight": (T, H),
         "bert.encoder.ln.weight": (H,), "bert.encoder.ln.bias": (H,),
         "bert.pooler.dense.weight": (H, H), "bert.pooler.dense.bias": (H,),
         "cls.predictions.transform.dense.weight": (H, H), "cls.predictions.transform.dense.bias": (H,),
         "cls.predictions.transform.LayerNorm.weight": (H,), "cls.predictions.transform.LayerNorm.bias": (H,),
         "cls.predictions.bias": (V,),
         "cls.seq_relationship.weight": (2, H), "cls.seq_relationship.bias": (2,)}
    for l in range(config["num_hidden_layers"]):
        pre = f"bert.encoder.layer.{l}."
        for n, shape in {"attention.ln": (H,), "ln": (H,)}.items():
            s[f"{pre}{n}.weight"], s[f"{pre}{n}.bias"] = shape, shape
        for n, (o, i) in {"attention.self.query": (H, H), "attention.self.key": (H, H),
                          "attention.self.value": (H, H), "attention.output.dense": (H, H),
                          "intermediate.dense": (F_, H), "output.dense": (H, F_)}.items():
            s[f"{pre}{n}.weight"], s[f"{pre}{n}.bias"] = (o, i), (o,)
    return s


class MegatronBert:
    def __init__(self, weights, config, precision="fp32"):
        if precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision {precision!r}: the BERT oracle knows fp32, bf16 and fp16")
        if config.get("hidden_act", "gelu_new") != "gelu_new":
            raise ValueError(f"hidden_act {config['hidden_act']!r}: the BERT oracle implements gelu_new")
        if not config.get("tie_word_embeddings", True):
            raise ValueError("the BERT oracle ties the MLM decoder to the word embeddings")
        self.c, self.r = config, rounding(precision)
        self.attention_rounding = attention_rounding(precision)
        want = hf_shapes(config)
        missing = sorted(set(want) - set(weights))
        extra = sorted(set(weights) - set(want))
        if missing or extra:
            raise ValueError(f"BERT weights: missing {missing[:5]}, unexpected {extra[:5]}")
        bad = [k for k in want if tuple(weights[k].shape) != want[k]]
        if bad:
            raise ValueError("BERT weights of the wrong shape: " +
                             ", ".join(f"{k} {tuple(weights[k].shape)} (expected {want[k]})" for k in bad[:5]))
        self.p = {k: weights[k].clone().requires_grad_(True) for k in want}

    def parameters(self):
        return self.p

    # Each op below returns its output rounded (self.r: the identity in fp32); p holds the
    # weights as the ops read them (rounded).
    def ln(self, x, p, name):
        return self.r(F.layer_norm(x, x.shape[-1:], p[name + ".weight"], p[name + ".bias"], self.c["layer_norm_eps"]))

    def linear(self, x, p, name):
        return self.r(x @ p[name + ".weight"].t() + p[name + ".bias"])

    def embed(self, p, tokens, token_types):
        S, r = tokens.shape[1], self.r
        x = r(p["bert.embeddings.word_embeddings.weight"][tokens.long()]
              + p["bert.embeddings.position_embeddings.weight"][torch.arange(S)])
        return r(x + p["bert.embeddings.token_type_embeddings.weight"][token_types.long()])

    def layer(self, p, l, x, keep):
        """Encoder layer l on x [B, S, H]; keep [B, S] bool: the keys attention may use."""
        c, pre, r = self.c, f"bert.encoder.layer.{l}.", self.r
        rs, rp = self.attention_rounding
        B, S, H = x.shape
        heads = c["num_attention_heads"]
        hd = H // heads
        h = self.ln(x, p, pre + "attention.ln")
        q, k, v = (self.linear(h, p, pre + "attention.self." + n).view(B, S, heads, hd).transpose(1, 2)
                   for n in ("query", "key", "value"))
        scores = rs((q @ k.transpose(-1, -2)) / math.sqrt(hd))
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        y = r((rp(scores.softmax(-1)) @ v).transpose(1, 2).reshape(B, S, H))
        x = r(x + self.linear(y, p, pre + "attention.output.dense"))
        h = self.ln(x, p, pre + "ln")
        m = r(gelu_new(self.linear(h, p, pre + "intermediate.dense")))
        return r(x + self.linear(m, p, pre + "output.dense"))

    def logits(self, batch):
        """(MLM logits [B, S, vocab], sentence-order logits [B, 2]) of a batch dict."""
        r = self.r
        p = {k: r(v) for k, v in self.p.items()}  # the weights the ops read
        keep = batch["attention_mask"] != 0
        if not bool(keep[:, 0].all()):
            raise ValueError("a sample's [CLS] (position 0) is masked in attention_mask")
        x = self.embed(p, batch["tokens"], batch["token_types"])
        for l in range(self.c["num_hidden_layers"]):
            x = self.layer(p, l, x, keep)
        x = self.ln(x, p, "bert.encoder.ln")
        t = self.ln(r(gelu_new(self.linear(x, p, "cls.predictions.transform.dense"))), p,
                    "cls.predictions.transform.LayerNorm")
        mlm = r(t @ p["bert.embeddings.word_embeddings.weight"].t() + p["cls.predictions.bias"])
        pooled = r(torch.tanh(self.linear(x[:, 0], p, "bert.pooler.dense")))
        return mlm, self.linear(pooled, p, "cls.seq_relationship")

    def losses(self, batch):
        """(masked-LM loss, sentence-order loss) of a batch dict (tokens, token_types,
        attention_mask, labels, loss_mask, sop_labels, sop_mask: each [B, S])."""
        mlm_logits, sop_logits = self.logits(batch)
        V = mlm_logits.shape[-1]
        mask = batch["loss_mask"].to(mlm_logits.dtype)
        labels = batch["labels"].long()
        used = labels[mask != 0]
        if used.numel() and (used.min() < 0 or used.max() >= V):
            raise ValueError(f"an MLM label outside [0, {V}) at a position of loss_mask 1")
        labels = torch.where(mask != 0, labels, torch.zeros_like(labels))  # unused labels may be anything
        nll = F.cross_entropy(mlm_logits.reshape(-1, V), labels.reshape(-1), reduction="none")
        mlm = (nll * mask.reshape(-1)).sum() / mask.sum()
        sop_mask = batch["sop_mask"].to(sop_logits.dtype)
        if bool((sop_mask[:, 1:] != 0).any()):
            raise ValueError("sop_mask is nonzero past position 0")
        sop_labels = batch["sop_labels"][:, 0].long()
        if bool(((sop_labels < 0) | (sop_labels > 1))[sop_mask[:, 0] != 0].any()):
            raise ValueError("a sentence-order label outside {0, 1}")
        sop_labels = torch.where(sop_mask[:, 0] != 0, sop_labels, torch.zeros_like(sop_labels))
        sop_nll = F.cross_entropy(sop_logits, sop_labels, reduction="none")
        sop = (sop_nll * sop_mask[:, 0]).sum() / sop_mask[:, 0].sum()
        return mlm, sop

    def loss(self, batch):
        mlm, sop = self.losses(batch)
        return mlm + sop


# Loom's BERT parameter names -> Hugging Face's, with the layout change:
#   "same": as it is; "t": Loom's [in, out] transposed to nn.Linear's [out, in];
#   "vocab": the rows past vocab_size (Loom's padding of the vocabulary) dropped;
#   "qkv": Loom's fused c_attn ([in, 3H] weight, [3H] bias; columns grouped per head as
#          [heads, 3 (q, k, v), head_dim]) split into query, key and value ({} in the target).
_LOOM_TO_HF = [
    (r"bert\.wte\.weight", "bert.embeddings.word_embeddings.weight", "vocab"),
    (r"bert\.wpe\.weight", "bert.embeddings.position_embeddings.weight", "same"),
    (r"bert\.tte\.weight", "bert.embeddings.token_type_embeddings.weight", "same"),
    (r"bert\.h\.(\d+)\.ln_1\.(weight|bias)", "bert.encoder.layer.{0}.attention.ln.{1}", "same"),
    (r"bert\.h\.(\d+)\.ln_2\.(weight|bias)", "bert.encoder.layer.{0}.ln.{1}", "same"),
    (r"bert\.h\.(\d+)\.attn\.c_attn\.(weight|bias)", "bert.encoder.layer.{0}.attention.self.{{}}.{1}", "qkv"),
    (r"bert\.h\.(\d+)\.attn\.c_proj\.weight", "bert.encoder.layer.{0}.attention.output.dense.weight", "t"),
    (r"bert\.h\.(\d+)\.attn\.c_proj\.bias", "bert.encoder.layer.{0}.attention.output.dense.bias", "same"),
    (r"bert\.h\.(\d+)\.mlp\.c_fc\.weight", "bert.encoder.layer.{0}.intermediate.dense.weight", "t"),
    (r"bert\.h\.(\d+)\.mlp\.c_fc\.bias", "bert.encoder.layer.{0}.intermediate.dense.bias", "same"),
    (r"bert\.h\.(\d+)\.mlp\.c_proj\.weight", "bert.encoder.layer.{0}.output.dense.weight", "t"),
    (r"bert\.h\.(\d+)\.mlp\.c_proj\.bias", "bert.encoder.layer.{0}.output.dense.bias", "same"),
    (r"bert\.ln_f\.(weight|bias)", "bert.encoder.ln.{0}", "same"),
    (r"bert\.pooler\.weight", "bert.pooler.dense.weight", "t"),
    (r"bert\.pooler\.bias", "bert.pooler.dense.bias", "same"),
    (r"cls\.dense\.weight", "cls.predictions.transform.dense.weight", "t"),
    (r"cls\.dense\.bias", "cls.predictions.transform.dense.bias", "same"),
    (r"cls\.ln\.(weight|bias)", "cls.predictions.transform.LayerNorm.{0}", "same"),
    (r"cls\.bias", "cls.predictions.bias", "vocab"),
    (r"cls\.seq_relationship\.weight", "cls.seq_relationship.weight", "t"),
    (r"cls\.seq_relationship\.bias", "cls.seq_relationship.bias", "same"),
]
_LOOM_TO_HF = [(re.compile(pattern + "$"), target, kind) for pattern, target, kind in _LOOM_TO_HF]


def loom_grads_to_hf(grads, config):
    """Loom's (assembled) BERT gradients {Loom name: tensor} under Hugging Face's names and
    layouts. A name not in the table, a target met twice, or a shape other than the Hugging Face
    parameter's is an error."""
    V, heads = config["vocab_size"], config["num_attention_heads"]
    want = hf_shapes(config)
    out = {}

    def put(name, g, source):
        if name in out:
            raise ValueError(f"Loom gradient {source}: {name} already mapped")
        if name not in want or tuple(g.shape) != want[name]:
            raise ValueError(f"Loom gradient {source} -> {name} {tuple(g.shape)}: expected "
                             f"{want.get(name, 'no such parameter')}")
        out[name] = g

    for name, g in grads.items():
        for pattern, target, kind in _LOOM_TO_HF:
            m = pattern.match(name)
            if m:
                break
        else:
            raise ValueError(f"Loom gradient {name}: not a BERT parameter the oracle knows")
        hf = target.format(*m.groups())
        if kind == "same":
            put(hf, g, name)
        elif kind == "t":
            put(hf, g.t().contiguous(), name)
        elif kind == "vocab":
            if g.shape[0] < V:
                raise ValueError(f"Loom gradient {name} {tuple(g.shape)}: fewer rows than the vocabulary {V}")
            put(hf, g[:V].contiguous(), name)
        else:  # qkv
            H = g.shape[-1] // 3
            hd = H // heads
            grouped = g.reshape(*g.shape[:-1], heads, 3, hd)
            for i, part in enumerate(("query", "key", "value")):
                x = grouped[..., i, :].reshape(*g.shape[:-1], H)
                put(hf.format(part), x.t().contiguous() if g.dim() == 2 else x.contiguous(), name)
    return out


def hf_to_loom(tensors, config, padded_vocab, pad=None):
    """The inverse of loom_grads_to_hf, for the self-test: Hugging Face tensors in Loom's names
    and layouts, the vocabulary padded to padded_vocab rows with pad(rows, *rest) (zeros if
    None)."""
    V, heads, L = config["vocab_size"], config["num_attention_heads"], config["num_hidden_layers"]
    pad = pad or (lambda *shape: torch.zeros(*shape))
    t = {k: v for k, v in tensors.items()}

    def padded(x):
        return torch.cat([x, pad(padded_vocab - V, *x.shape[1:]).to(x.dtype)])

    out = {"bert.wte.weight": padded(t["bert.embeddings.word_embeddings.weight"]),
           "bert.wpe.weight": t["bert.embeddings.position_embeddings.weight"],
           "bert.tte.weight": t["bert.embeddings.token_type_embeddings.weight"],
           "bert.ln_f.weight": t["bert.encoder.ln.weight"], "bert.ln_f.bias": t["bert.encoder.ln.bias"],
           "bert.pooler.weight": t["bert.pooler.dense.weight"].t(), "bert.pooler.bias": t["bert.pooler.dense.bias"],
           "cls.dense.weight": t["cls.predictions.transform.dense.weight"].t(),
           "cls.dense.bias": t["cls.predictions.transform.dense.bias"],
           "cls.ln.weight": t["cls.predictions.transform.LayerNorm.weight"],
           "cls.ln.bias": t["cls.predictions.transform.LayerNorm.bias"],
           "cls.bias": padded(t["cls.predictions.bias"]),
           "cls.seq_relationship.weight": t["cls.seq_relationship.weight"].t(),
           "cls.seq_relationship.bias": t["cls.seq_relationship.bias"]}
    for l in range(L):
        hf, lo = f"bert.encoder.layer.{l}.", f"bert.h.{l}."
        for s in ("weight", "bias"):
            out[f"{lo}ln_1.{s}"] = t[f"{hf}attention.ln.{s}"]
            out[f"{lo}ln_2.{s}"] = t[f"{hf}ln.{s}"]
            q, k, v = (t[f"{hf}attention.self.{n}.{s}"] for n in ("query", "key", "value"))
            if s == "weight":  # [out, in] -> [in, heads, 3, hd] -> [in, 3H]
                H = q.shape[0]
                out[f"{lo}attn.c_attn.weight"] = torch.stack(
                    [x.t().reshape(H, heads, H // heads) for x in (q, k, v)], 2).reshape(H, 3 * H)
            else:
                H = q.shape[0]
                out[f"{lo}attn.c_attn.bias"] = torch.stack(
                    [x.reshape(heads, H // heads) for x in (q, k, v)], 1).reshape(3 * H)
        for lo_n, hf_n in (("attn.c_proj", "attention.output.dense"), ("mlp.c_fc", "intermediate.dense"),
                           ("mlp.c_proj", "output.dense")):
            out[f"{lo}{lo_n}.weight"] = t[f"{hf}{hf_n}.weight"].t()
            out[f"{lo}{lo_n}.bias"] = t[f"{hf}{hf_n}.bias"]
    return out
