"""Checks bert_oracle.MegatronBert and its gradient mapping on a tiny random BERT (2 layers,
hidden 16, 4 heads, ffn 64, vocab 37 padded to 40, sequence 10, batch 3, padded samples), without
Loom:

(a) the gradient mapping: Hugging Face tensors put in Loom's names and layouts (hf_to_loom, the
    vocabulary padded with junk rows) map back exactly; an unknown Loom name, a duplicate and a
    wrong shape are errors. And a model written in Loom's layout (x W with W [in, out], the fused
    c_attn grouped [heads, 3, head_dim], padded vocabulary) on the same weights has the oracle's
    loss, and its gradients mapped by loom_grads_to_hf are the oracle's gradients;
(b) padding: changing the padded positions' tokens and token types leaves every unpadded
    position's MLM logits, the sentence-order logits and the loss bit for bit the same (while the
    mask does matter, and an unpadded token changes the other positions);
(c) autograd gradients against central finite differences in float64 on entries of every kind of
    parameter;
(d) each encoder layer against torch.nn.TransformerEncoderLayer(norm_first=True) with the same
    weights and key padding mask, and the losses against a per-sample loop;
(e) bf16 and fp16 move the loss and gradients off fp32's by about their precision.

usage: python3 bert_oracle_selftest.py (exit 0: all checks pass)
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bert_oracle import MegatronBert, gelu_new, hf_shapes, hf_to_loom, loom_grads_to_hf  # noqa: E402

L, H, HEADS, FF, V, VPAD, P, S, B = 2, 16, 4, 64, 37, 40, 12, 10, 3
CONFIG = {"architectures": ["MegatronBertForPreTraining"], "model_type": "megatron-bert", "vocab_size": V,
          "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": HEADS, "intermediate_size": FF,
          "max_position_embeddings": P, "type_vocab_size": 2, "layer_norm_eps": 1e-5, "hidden_act": "gelu_new",
          "tie_word_embeddings": True}
failed = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name:70} {detail}", flush=True)
    if not ok:
        failed.append(name)


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def weights(gen, dtype=torch.float64):
    w = {}
    for k, shape in hf_shapes(CONFIG).items():
        if k.endswith(("ln.weight", "LayerNorm.weight")):
            w[k] = 1 + 0.2 * torch.randn(shape, generator=gen, dtype=dtype)
        elif len(shape) == 2 and "embeddings" not in k:
            w[k] = torch.randn(shape, generator=gen, dtype=dtype) / math.sqrt(shape[1])
        else:
            w[k] = 0.5 * torch.randn(shape, generator=gen, dtype=dtype)
    return w


def batch(gen, dtype=torch.float64):
    lengths = [S, 7, 4]  # sample 0 unpadded, samples 1 and 2 padded after their length
    tokens = torch.randint(0, V, (B, S), generator=gen, dtype=torch.int32)
    token_types = torch.zeros(B, S, dtype=torch.int32)
    attention_mask = torch.zeros(B, S, dtype=dtype)
    loss_mask = torch.zeros(B, S, dtype=dtype)
    for b, n in enumerate(lengths):
        token_types[b, n // 2:n] = 1
        attention_mask[b, :n] = 1
        loss_mask[b, 1:n] = (torch.rand(n - 1, generator=gen) < 0.5).to(dtype)
        loss_mask[b, 1 + b] = 1
    labels = torch.randint(0, V, (B, S), generator=gen, dtype=torch.int32)
    labels[loss_mask == 0] = -1  # unused labels: anything
    sop_labels = torch.zeros(B, S, dtype=torch.int32)
    sop_labels[:, 0] = torch.tensor([0, 1, 1], dtype=torch.int32)
    sop_mask = torch.zeros(B, S, dtype=dtype)
    sop_mask[:, 0] = 1
    return {"tokens": tokens, "token_types": token_types, "attention_mask": attention_mask, "labels": labels,
            "loss_mask": loss_mask, "sop_labels": sop_labels, "sop_mask": sop_mask}, lengths


def loom_layout_loss(lw, bt):
    """The same BERT written directly in Loom's layout (from the layout's description, not through
    hf_to_loom's inverse): [in, out] weights, the fused per-head c_attn, the padded vocabulary
    (logits over the first V rows only)."""
    eps = CONFIG["layer_norm_eps"]
    hd = H // HEADS

    def ln(x, n):
        return F.layer_norm(x, (H,), lw[n + ".weight"], lw[n + ".bias"], eps)

    x = lw["bert.wte.weight"][bt["tokens"].long()] + lw["bert.wpe.weight"][:S] + lw["bert.tte.weight"][
        bt["token_types"].long()]
    keep = bt["attention_mask"] != 0
    for l in range(L):
        pre = f"bert.h.{l}."
        h = ln(x, pre + "ln_1")
        qkv = (h @ lw[pre + "attn.c_attn.weight"] + lw[pre + "attn.c_attn.bias"]).view(B, S, HEADS, 3, hd)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        a = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~keep[:, None, None], float("-inf")).softmax(-1)
        y = (a @ v).transpose(1, 2).reshape(B, S, H)
        x = x + y @ lw[pre + "attn.c_proj.weight"] + lw[pre + "attn.c_proj.bias"]
        h = ln(x, pre + "ln_2")
        x = x + gelu_new(h @ lw[pre + "mlp.c_fc.weight"] + lw[pre + "mlp.c_fc.bias"]) @ lw[pre + "mlp.c_proj.weight"] \
            + lw[pre + "mlp.c_proj.bias"]
    x = ln(x, "bert.ln_f")
    t = ln(gelu_new(x @ lw["cls.dense.weight"] + lw["cls.dense.bias"]), "cls.ln")
    logits = (t @ lw["bert.wte.weight"].t() + lw["cls.bias"])[..., :V]
    pooled = torch.tanh(x[:, 0] @ lw["bert.pooler.weight"] + lw["bert.pooler.bias"])
    sop_logits = pooled @ lw["cls.seq_relationship.weight"] + lw["cls.seq_relationship.bias"]
    return reference_losses(logits, sop_logits, bt)


def reference_losses(logits, sop_logits, bt):
    """mlm + sop by loops over samples and positions."""
    num, den, sop = 0.0, 0.0, 0.0
    for b in range(B):
        for s in range(S):
            if bt["loss_mask"][b, s] != 0:
                num = num - torch.log_softmax(logits[b, s], -1)[bt["labels"][b, s].long()] * bt["loss_mask"][b, s]
                den += float(bt["loss_mask"][b, s])
        sop = sop - torch.log_softmax(sop_logits[b], -1)[bt["sop_labels"][b, 0].long()]
    return num / den + sop / B


def mapping_checks(gen):
    hf = {k: v.float() for k, v in weights(gen).items()}
    junk = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    lo = hf_to_loom(hf, CONFIG, VPAD, junk)
    back = loom_grads_to_hf(lo, CONFIG)
    check("(a) round trip HF -> Loom -> HF: same names", set(back) == set(hf), f"{len(back)} tensors")
    check("(a) round trip HF -> Loom -> HF: bit-identical", all(torch.equal(back[k], hf[k]) for k in hf))
    check("(a) Loom layout shapes", tuple(lo["bert.h.0.attn.c_attn.weight"].shape) == (H, 3 * H)
          and tuple(lo["bert.wte.weight"].shape) == (VPAD, H) and tuple(lo["cls.bias"].shape) == (VPAD,)
          and tuple(lo["cls.seq_relationship.weight"].shape) == (H, 2))
    # c_attn columns: head 0's q, k, v, then head 1's ...; column 5 of head 1's key is column
    # (1 * 3 + 1) * hd + 1 of c_attn (hd 4), the key weight's row 1 * hd + 1.
    hd = H // HEADS
    check("(a) c_attn column grouping [heads, 3, head_dim]", torch.equal(
        lo["bert.h.1.attn.c_attn.weight"][:, (1 * 3 + 1) * hd + 1], hf["bert.encoder.layer.1.attention.self.key.weight"][
            1 * hd + 1]))
    for what, bad in (("unknown name", dict(lo, **{"bert.h.0.attn.rotary": torch.zeros(3)})),
                      ("wrong shape", dict(lo, **{"bert.pooler.bias": torch.zeros(H + 1)})),
                      ("layer past the config", dict(lo, **{f"bert.h.{L}.ln_1.weight": torch.zeros(H)})),
                      ("vocabulary too short", dict(lo, **{"cls.bias": torch.zeros(V - 1)}))):
        try:
            loom_grads_to_hf(bad, CONFIG)
            check(f"(a) {what} is an error", False)
        except ValueError as e:
            check(f"(a) {what} is an error", True, str(e)[:60])

    # Gradients: a Loom-layout model's autograd gradients, mapped, against the oracle's.
    w = weights(gen)
    bt, _ = batch(gen)
    oracle = MegatronBert(w, CONFIG)
    loss = oracle.loss(bt)
    loss.backward()
    lw = {k: v.detach().clone().requires_grad_(True) for k, v in hf_to_loom(w, CONFIG, VPAD, junk).items()}
    lloss = loom_layout_loss(lw, bt)
    lloss.backward()
    check("(a) Loom-layout model's loss = the oracle's (float64)", abs(lloss.item() - loss.item()) < 1e-12 * abs(loss.item()),
          f"{loss.item():.12f} vs {lloss.item():.12f}")
    mapped = loom_grads_to_hf({k: v.grad for k, v in lw.items()}, CONFIG)
    # The key bias's gradient is zero in exact arithmetic (softmax ignores a constant shift of a
    # row's scores): rounding noise in both, compared in absolute terms.
    key_bias = [k for k in mapped if k.endswith("attention.self.key.bias")]
    worst = max((rel(mapped[k], q.grad), k) for k, q in oracle.parameters().items() if k not in key_bias)
    check("(a) Loom-layout gradients mapped = the oracle's gradients", worst[0] < 1e-10, f"worst rel {worst[0]:.1e} ({worst[1]})")
    noise = max(max(float(mapped[k].abs().max()), float(oracle.parameters()[k].grad.abs().max())) for k in key_bias)
    check("(a) (the key biases' gradients: zero up to rounding in both)", noise < 1e-12, f"max {noise:.1e}")
    check("(a) the padded vocabulary rows get no gradient", float(lw["bert.wte.weight"].grad[V:].abs().max()) == 0
          and float(lw["cls.bias"].grad[V:].abs().max()) == 0)
    check("(d) loss = per-sample loop (mlm + sop)", rel(loss.detach(), reference_losses(*oracle.logits(bt), bt).detach())
          < 1e-12)


def padding_checks(gen):
    w = weights(gen)
    oracle = MegatronBert(w, CONFIG)
    bt, lengths = batch(gen)
    with torch.no_grad():
        mlm, sop = oracle.logits(bt)
        loss = oracle.loss(bt)
        changed = {k: v.clone() for k, v in bt.items()}
        for b, n in enumerate(lengths):
            changed["tokens"][b, n:] = (changed["tokens"][b, n:] + 1 + b) % V
            changed["token_types"][b, n:] = 1 - changed["token_types"][b, n:]
        mlm2, sop2 = oracle.logits(changed)
        same = all(torch.equal(mlm[b, :n], mlm2[b, :n]) for b, n in enumerate(lengths))
        check("(b) padded tokens changed: unpadded MLM logits bit-identical", same)
        check("(b) padded tokens changed: sentence-order logits bit-identical", torch.equal(sop, sop2))
        check("(b) padded tokens changed: loss bit-identical", torch.equal(loss, oracle.loss(changed)))
        moved = any(not torch.equal(mlm[b, n:], mlm2[b, n:]) for b, n in enumerate(lengths) if n < S)
        check("(b) (their own positions' logits do change)", moved)
        unmasked = dict(bt, attention_mask=torch.ones_like(bt["attention_mask"]))
        mlm3, _ = oracle.logits(unmasked)
        check("(b) (the attention mask matters: all-ones changes unpadded logits)",
              not torch.equal(mlm[1, :lengths[1]], mlm3[1, :lengths[1]]))
        other = {k: v.clone() for k, v in bt.items()}
        other["tokens"][1, 2] = (other["tokens"][1, 2] + 1) % V
        mlm4, _ = oracle.logits(other)
        check("(b) (an unpadded token changes its sample's other positions)", not torch.equal(mlm[1, 0], mlm4[1, 0])
              and torch.equal(mlm[0], mlm4[0]))


def finite_difference_checks(gen):
    w = weights(gen)
    oracle = MegatronBert(w, CONFIG)
    bt, lengths = batch(gen)
    oracle.loss(bt).backward()
    p = oracle.parameters()
    picks = {"bert.embeddings.word_embeddings.weight": [(int(bt["tokens"][0, 3]), 5), (int(bt["tokens"][2, 1]), 0)],
             "bert.embeddings.position_embeddings.weight": [(2, 7), (0, 1)],
             "bert.embeddings.token_type_embeddings.weight": [(1, 3)],
             "bert.encoder.layer.0.attention.ln.weight": [(4,)], "bert.encoder.layer.1.ln.bias": [(9,)],
             "bert.encoder.layer.0.attention.self.query.weight": [(5, 11)],
             "bert.encoder.layer.1.attention.self.key.weight": [(13, 2)],
             "bert.encoder.layer.1.attention.self.value.bias": [(6,)],
             "bert.encoder.layer.0.attention.output.dense.weight": [(3, 8)],
             "bert.encoder.layer.1.intermediate.dense.weight": [(40, 7)],
             "bert.encoder.layer.0.output.dense.bias": [(12,)],
             "bert.encoder.ln.weight": [(1,)],
             "bert.pooler.dense.weight": [(2, 14)], "bert.pooler.dense.bias": [(10,)],
             "cls.predictions.transform.dense.weight": [(15, 0)],
             "cls.predictions.transform.LayerNorm.bias": [(3,)],
             "cls.predictions.bias": [(int(bt["labels"][0, 1].clamp_min(0)),), (V - 1,)],
             "cls.seq_relationship.weight": [(1, 4)], "cls.seq_relationship.bias": [(0,)]}
    eps, worst, where = 1e-6, 0.0, ""
    for name, entries in picks.items():
        for idx in entries:
            with torch.no_grad():
                q = p[name]
                orig = q[idx].item()
                q[idx] = orig + eps
                up = oracle.loss(bt).item()
                q[idx] = orig - eps
                down = oracle.loss(bt).item()
                q[idx] = orig
            fd, ad = (up - down) / (2 * eps), q.grad[idx].item()
            err = abs(fd - ad) / max(abs(ad), 1e-6)
            if err > worst:
                worst, where = err, f"{name}{list(idx)}: autograd {ad:.3e}, fd {fd:.3e}"
    check(f"(c) autograd = central differences, {sum(map(len, picks.values()))} entries (float64)", worst < 1e-5,
          f"worst rel {worst:.1e} ({where})")
    zero = [k for k, q in p.items() if not k.endswith("key.bias") and (q.grad is None or float(q.grad.abs().max()) < 1e-8)]
    check("(c) every parameter but the key biases gets a gradient", not zero, ", ".join(zero[:3]))


def torch_layer_checks(gen):
    w = weights(gen)
    oracle = MegatronBert(w, CONFIG)
    bt, lengths = batch(gen)
    p = oracle.parameters()
    x = torch.randn(B, S, H, generator=gen, dtype=torch.float64)
    keep = bt["attention_mask"] != 0
    for l in range(L):
        pre = f"bert.encoder.layer.{l}."
        ref = torch.nn.TransformerEncoderLayer(H, HEADS, FF, dropout=0.0, activation=gelu_new,
                                               layer_norm_eps=CONFIG["layer_norm_eps"], batch_first=True,
                                               norm_first=True, dtype=torch.float64)
        with torch.no_grad():
            sa = ref.self_attn
            sa.in_proj_weight.copy_(torch.cat([p[pre + f"attention.self.{n}.weight"] for n in ("query", "key", "value")]))
            sa.in_proj_bias.copy_(torch.cat([p[pre + f"attention.self.{n}.bias"] for n in ("query", "key", "value")]))
            sa.out_proj.weight.copy_(p[pre + "attention.output.dense.weight"])
            sa.out_proj.bias.copy_(p[pre + "attention.output.dense.bias"])
            for mod, n in ((ref.norm1, "attention.ln"), (ref.norm2, "ln"), (ref.linear1, "intermediate.dense"),
                           (ref.linear2, "output.dense")):
                mod.weight.copy_(p[pre + n + ".weight"])
                mod.bias.copy_(p[pre + n + ".bias"])
            ref.train()  # the plain path (the fast path drops padded positions)
            want = ref(x, src_key_padding_mask=~keep)
            got = oracle.layer(p, l, x, keep)
        err = max(rel(got[b, :n], want[b, :n]) for b, n in enumerate(lengths))
        check(f"(d) layer {l} = nn.TransformerEncoderLayer(norm_first) on unpadded positions", err < 1e-12,
              f"rel {err:.1e}")


def mixed_precision_checks(gen):
    """bf16 and fp16 round (the loss and the gradients move off fp32's) by about their precision
    (bf16's 2^-8 more than fp16's 2^-11), so the 16-bit oracles are neither fp32 in disguise nor
    broken."""
    w = weights(gen, torch.float32)
    bt, _ = batch(gen, torch.float32)
    runs = {}
    for precision in ("fp32", "bf16", "fp16"):
        m = MegatronBert(w, CONFIG, precision)
        loss = m.loss(bt)
        loss.backward()
        runs[precision] = (loss.detach(), torch.cat([q.grad.flatten() for q in m.parameters().values()]))
    for precision, bound in (("bf16", 2e-2), ("fp16", 3e-3)):
        loss_err = abs((runs[precision][0] - runs["fp32"][0]) / runs["fp32"][0]).item()
        grad_err = rel(runs[precision][1], runs["fp32"][1])
        check(f"{precision}: loss and gradients off fp32's, within {bound:g}", 0 < loss_err < bound and 0 < grad_err < 5 * bound,
              f"loss rel {loss_err:.1e}, gradients rel {grad_err:.1e}")
    check("fp16 closer to fp32 than bf16", rel(runs["fp16"][1], runs["fp32"][1]) < rel(runs["bf16"][1], runs["fp32"][1]))


def config_checks(gen):
    w = weights(gen)
    for what, make in (("an unknown precision (fp8) is refused", lambda: MegatronBert(w, CONFIG, "fp8")),
                       ("a missing weight is an error",
                        lambda: MegatronBert({k: v for k, v in w.items() if k != "cls.predictions.bias"}, CONFIG)),
                       ("an extra weight (a stored decoder) is an error",
                        lambda: MegatronBert(dict(w, **{"cls.predictions.decoder.weight": w[
                            "bert.embeddings.word_embeddings.weight"]}), CONFIG)),
                       ("hidden_act gelu (erf) is refused", lambda: MegatronBert(w, dict(CONFIG, hidden_act="gelu")))):
        try:
            make()
            check(f"config: {what}", False)
        except ValueError as e:
            check(f"config: {what}", True, str(e)[:60])


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(41)
    mapping_checks(gen)
    padding_checks(gen)
    finite_difference_checks(gen)
    torch_layer_checks(gen)
    mixed_precision_checks(gen)
    config_checks(gen)
    print(f"{'all checks pass' if not failed else f'{len(failed)} FAILED'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
