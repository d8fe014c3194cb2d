"""Checks mixtral_oracle.Mixtral against straightforward implementations of the same math on a
tiny random Mixtral (2 layers, hidden 16, ffn 32, 4 experts, top-2, 4 heads, 2 KV heads, vocab
50, sequence 8, batch 2):

- the MoE block (output and gradients) against a per-token loop, dropless and with
  capacity_factor 0.5 (some assignments must be dropped), and the capacity's tie rules;
- 16-bit runs' use of Loom's routing: its choices and kept assignments taken within the tie
  margin, a larger difference listed as a mismatch;
- each layer's load-balancing loss (value and gradient) against Hugging Face's
  load_balancing_loss_func written out for one layer;
- the whole model: a Mixtral whose layers are all dense is Llama; one expert with top-1 is the
  dense MLP (aux 1 per layer); a layer mix (moe_layer_freq 2) runs and every weight gets a
  gradient; run_oracle's split of Loom's stacked expert gradients.

usage: python3 mixtral_oracle_selftest.py (exit 0: all checks pass)
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_oracle import Llama  # noqa: E402
from mixtral_oracle import Mixtral  # noqa: E402

L, H, FF, E, K, HEADS, KV, VOCAB, S, B = 2, 16, 32, 4, 2, 4, 2, 50, 8, 2


def config(**over):
    c = {"architectures": ["MixtralForCausalLM"], "vocab_size": VOCAB, "hidden_size": H, "intermediate_size": FF,
         "num_hidden_layers": L, "num_attention_heads": HEADS, "num_key_value_heads": KV, "rope_theta": 10000.0,
         "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "num_local_experts": E, "num_experts_per_tok": K,
         "router_aux_loss_coef": 0.02}
    c.update(over)
    return c


def weights(gen, experts=E, dense_layers=(), moe_layers=None):
    hd = H // HEADS
    w = {"model.embed_tokens.weight": torch.randn(VOCAB, H, generator=gen),
         "model.norm.weight": 1 + 0.1 * torch.randn(H, generator=gen),
         "lm_head.weight": 0.3 * torch.randn(VOCAB, H, generator=gen)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(H, generator=gen)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(H, generator=gen)
        for n, (o, i_) in {"q_proj": (H, H), "k_proj": (KV * hd, H), "v_proj": (KV * hd, H), "o_proj": (H, H)}.items():
            w[f"{p}self_attn.{n}.weight"] = torch.randn(o, i_, generator=gen) / math.sqrt(i_)
        if i in dense_layers:
            for n, (o, i_) in {"gate_proj": (FF, H), "up_proj": (FF, H), "down_proj": (H, FF)}.items():
                w[f"{p}mlp.{n}.weight"] = torch.randn(o, i_, generator=gen) / math.sqrt(i_)
            continue
        m = p + "block_sparse_moe."
        w[m + "gate.weight"] = torch.randn(experts, H, generator=gen)
        for e in range(experts):
            for n, (o, i_) in {"w1": (FF, H), "w3": (FF, H), "w2": (H, FF)}.items():
                w[f"{m}experts.{e}.{n}.weight"] = torch.randn(o, i_, generator=gen) / math.sqrt(i_)
    return w


def loop_moe(x, gate, w1, w3, w2, k, capacity_factor):
    """The MoE block token by token (x [T, H]; w1/w3/w2 lists over experts): Python sorts for the
    top-k and the capacity. (output [T, H], dropped)."""
    T, E_ = x.shape[0], gate.shape[0]
    assignments = []  # (token, expert, weight)
    for t in range(T):
        probs = torch.softmax(x[t] @ gate.t(), -1)
        ranked = sorted(range(E_), key=lambda e: (-probs[e].item(), e))[:k]
        total = sum(probs[e] for e in ranked)
        assignments += [(t, e, probs[e] / total) for e in ranked]
    kept = assignments
    if capacity_factor > 0:
        cap = math.ceil(capacity_factor * T * k / E_)
        kept = []
        for e in range(E_):
            mine = [a for a in assignments if a[1] == e]
            kept += sorted(mine, key=lambda a: (-a[2].item(), a[0]))[:cap]
    rows = []
    for t in range(T):
        y = torch.zeros(x.shape[1])
        for (u, e, wt) in assignments:  # in the token's slot order
            if u == t and any(a[0] == t and a[1] == e for a in kept):
                y = y + wt * ((F.silu(x[t] @ w1[e].t()) * (x[t] @ w3[e].t())) @ w2[e].t())
        rows.append(y)
    return torch.stack(rows), len(assignments) - len(kept)


def hf_load_balancing_loss(gate_logits, num_experts, top_k):
    """transformers' load_balancing_loss_func for one layer's logits, no attention mask."""
    routing_weights = torch.nn.functional.softmax(gate_logits, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected_experts, num_experts)
    tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    overall_loss = torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0))
    return overall_loss * num_experts


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(name, err, tol=1e-5):
    ok = err < tol
    print(f"{'ok  ' if ok else 'FAIL'} {name:62} rel {err:.1e}", flush=True)
    if not ok:
        check.failed = True


check.failed = False


def moe_block_checks(gen):
    for cf in (0.0, 0.5):
        w = weights(gen)
        model = Mixtral(w, config(capacity_factor=cf))
        p = model.parameters()
        h = torch.randn(B, S, H, generator=gen, requires_grad=True)
        for i in range(L):
            pre, m = f"model.layers.{i}.", f"model.layers.{i}.block_sparse_moe."
            y, aux, dropped, assigned = model.moe(p, pre, h)
            names = [m + "gate.weight"] + [f"{m}experts.{e}.{n}.weight" for n in ("w1", "w3", "w2") for e in range(E)]
            w1, w3, w2 = ([p[f"{m}experts.{e}.{n}.weight"] for e in range(E)] for n in ("w1", "w3", "w2"))
            ref, ref_dropped = loop_moe(h.reshape(-1, H), p[m + "gate.weight"], w1, w3, w2, K, cf)
            what = "dropless" if cf == 0 else f"capacity_factor {cf}"
            check(f"layer {i} MoE output, {what}", rel(y.reshape(-1, H), ref))
            cap = model.capacity(B * S)
            print(f"     assignments {assigned}, dropped {dropped} (loop: {ref_dropped}), capacity {cap}")
            assert assigned == B * S * K and dropped == ref_dropped, (assigned, dropped, ref_dropped)
            if cf > 0:
                assert cap == math.ceil(cf * B * S * K / E) and dropped > 0, (cap, dropped)
            else:
                assert cap is None and dropped == 0
            # gradients of a random projection of the output
            g = torch.randn(B * S, H, generator=gen)
            ins = [h] + [p[n] for n in names]
            got = torch.autograd.grad((y.reshape(-1, H) * g).sum(), ins, allow_unused=True)
            want = torch.autograd.grad((ref * g).sum(), ins, allow_unused=True)
            unused = [n for n, a, b in zip(["h"] + names, got, want) if (a is None) != (b is None)]
            assert not unused, unused
            worst = max(rel(a, b) for a, b in zip(got, want) if b is not None and b.norm() > 0)
            check(f"layer {i} MoE gradients (h, router, experts), {what}", worst)


def tie_checks():
    """A zero router: every probability 1/E, so every token picks experts 0 and 1 (ties: the
    lower expert) with weight 1/2; with capacity 4, experts 0 and 1 keep tokens 0-3 (ties: the
    lower token), the other tokens' outputs are 0."""
    gen = torch.Generator().manual_seed(3)
    w = weights(gen)
    model = Mixtral(w, config(capacity_factor=0.5))
    p = dict(model.parameters())
    p["model.layers.0.block_sparse_moe.gate.weight"] = torch.zeros(E, H)
    x = torch.randn(B, S, H, generator=gen)
    y, _, dropped, assigned = model.moe(p, "model.layers.0.", x)
    y = y.reshape(-1, H)
    _, _, experts = model.route(torch.zeros(B * S, E))
    assert (experts == torch.tensor([0, 1])).all(), experts
    nonzero = [t for t in range(B * S) if y[t].abs().max() > 0]
    assert nonzero == [0, 1, 2, 3] and dropped == 2 * (B * S - 4) and assigned == 2 * B * S, (nonzero, dropped)
    print("ok   ties: top-k to the lower expert, capacity to the lower token")


def loom_choice_checks():
    """16-bit runs (run_oracle.py): the oracle takes Loom's top-k choice of a token, and an expert
    over capacity Loom's kept assignments, only where they differ from its own within the tie
    margin; a larger difference is listed as a mismatch and the oracle keeps its own."""
    model = Mixtral(weights(torch.Generator().manual_seed(4)), config(capacity_factor=0.5))
    model.tie_margin = 0.01
    # top-k: token 0's third probability is 0.005 below its second (Loom's [0, 2] taken), token
    # 1's 0.15 below (Loom's [0, 2] a mismatch), token 2 agrees.
    probs = torch.tensor([[0.4, 0.3, 0.295, 0.005], [0.4, 0.35, 0.2, 0.05], [0.1, 0.2, 0.3, 0.4]])
    model.loom_routing = {0: torch.tensor([[0, 2], [0, 2], [3, 2]], dtype=torch.int32).flatten()}
    _, _, experts = model.route(probs.log(), layer=0)
    assert experts.tolist() == [[0, 2], [0, 1], [3, 2]], experts
    assert model.routing_adopted == 1 and len(model.routing_mismatches) == 1, model.routing_mismatches
    # capacity 3 of expert 0's 4 assignments (slot 0 of tokens 0-3, weights 0.6, 0.5, 0.505,
    # 0.9): the oracle drops token 1's. Loom dropping token 2's (0.005 from the last kept
    # weight, 0.505) is taken; Loom dropping token 0's (0.6, 0.095 away) is a mismatch.
    w = torch.tensor([[0.6, 0.4], [0.5, 0.5], [0.505, 0.495], [0.9, 0.1]])
    experts = torch.tensor([[0, 1], [0, 1], [0, 1], [0, 1]])
    def loom_kept(dropped_token):
        kept = experts.clone()
        kept[dropped_token, 0] = -1
        return {0: kept.flatten().to(torch.int32)}
    model.routing_mismatches, model.loom_kept = [], None
    assert model.kept(w, experts, 0, 3, layer=0)[0].tolist() == [0, 2, 3]
    model.loom_kept = loom_kept(2)
    assert model.kept(w, experts, 0, 3, layer=0)[0].tolist() == [0, 1, 3]
    assert model.kept_adopted == 1 and not model.routing_mismatches, model.routing_mismatches
    model.loom_kept = loom_kept(0)
    assert model.kept(w, experts, 0, 3, layer=0)[0].tolist() == [0, 2, 3]
    assert model.kept_adopted == 1 and len(model.routing_mismatches) == 1, model.routing_mismatches
    model.loom_kept = {}
    model.kept(w, experts, 0, 3, layer=0)
    assert "no kept assignments" in model.routing_mismatches[-1], model.routing_mismatches
    print("ok   Loom's choices and kept assignments taken within the tie margin only")


def aux_checks(gen):
    w = weights(gen)
    model = Mixtral(w, config())
    p = model.parameters()
    for i in range(L):
        gate = p[f"model.layers.{i}.block_sparse_moe.gate.weight"]
        x = torch.randn(B * S, H, generator=gen)
        probs, _, experts = model.route(x @ gate.t())
        aux = model.aux_loss(probs, experts)
        ref = hf_load_balancing_loss(x @ gate.t(), E, K)
        check(f"layer {i} load-balancing loss against load_balancing_loss_func", rel(aux, ref))
        (ga,), (gr,) = torch.autograd.grad(aux, [gate]), torch.autograd.grad(ref, [gate])
        check(f"layer {i} its gradient (router weight)", rel(ga, gr))
        _, aux_block, _, _ = model.moe(p, f"model.layers.{i}.", x.reshape(B, S, H))
        check(f"layer {i} the MoE block's loss is the same", rel(aux_block, ref))


def model_checks(gen):
    tokens = torch.randint(0, VOCAB, (B, S), generator=gen, dtype=torch.int32)
    labels = torch.randint(0, VOCAB, (B, S), generator=gen, dtype=torch.int32)
    mask = torch.ones(B, S)
    mask[1, -3:] = 0
    # all layers dense: Llama
    w = weights(gen, dense_layers=range(L))
    ce, aux, dropped, assigned = Mixtral(w, config()).losses(tokens, labels, mask)
    check("all-dense Mixtral's ce against Llama's loss", rel(ce, Llama(w, config()).loss(tokens, labels, mask)), 1e-7)
    assert float(aux) == 0 and dropped == 0 and assigned == 0
    # one expert, top-1: the dense MLP with that expert's weights; aux = 1 per layer
    w1 = weights(gen, experts=1)
    dense = {k: v for k, v in w1.items() if "block_sparse_moe" not in k}
    for i in range(L):
        m = f"model.layers.{i}.block_sparse_moe.experts.0."
        for a, b in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            dense[f"model.layers.{i}.mlp.{b}.weight"] = w1[m + a + ".weight"]
    ce, aux, _, _ = Mixtral(w1, config(num_local_experts=1, num_experts_per_tok=1)).losses(tokens, labels, mask)
    check("one expert, top-1: ce against Llama with it as the dense MLP", rel(ce, Llama(dense, config()).loss(
        tokens, labels, mask)), 1e-6)
    check("one expert, top-1: aux sum = layers", abs(float(aux) - L) / L)
    # moe_layer_freq 2: layer 0 MoE, layer 1 dense; capacity on
    w = weights(gen, dense_layers=(1,))
    model = Mixtral(w, config(capacity_factor=0.5))
    ce, aux, dropped, assigned = model.losses(tokens, labels, mask)
    assert assigned == B * S * K and dropped > 0, (assigned, dropped)
    loss = model.loss(tokens, labels, mask)
    check("loss = ce + router_aux_loss_coef * aux", rel(loss, ce + 0.02 * aux), 1e-7)
    loss.backward()
    p = model.parameters()
    missing = [k for k, q in p.items() if q.grad is None or not torch.isfinite(q.grad).all()]
    assert not missing, missing
    print(f"ok   mixed layers: ce {ce.item():.4f}, aux {aux.item():.4f}, dropped {dropped} of {assigned}, "
          f"{len(p)} weights with finite gradients")


def driver_checks():
    sys.argv = sys.argv[:1]
    import run_oracle
    stacked = {"model.layers.0.block_sparse_moe.experts.w1.weight": torch.arange(E * FF * H, dtype=torch.float32)
               .reshape(E, FF, H),
               "model.layers.0.block_sparse_moe.experts.w2.weight": torch.randn(E, H, FF),
               "model.layers.0.block_sparse_moe.gate.weight": torch.randn(E, H)}
    out = run_oracle.split_expert_grads(stacked)
    assert sorted(out) == sorted(["model.layers.0.block_sparse_moe.gate.weight"] +
                                 [f"model.layers.0.block_sparse_moe.experts.{e}.{n}.weight" for e in range(E)
                                  for n in ("w1", "w2")]), sorted(out)
    for e in range(E):
        assert torch.equal(out[f"model.layers.0.block_sparse_moe.experts.{e}.w1.weight"],
                           stacked["model.layers.0.block_sparse_moe.experts.w1.weight"][e])
        assert out[f"model.layers.0.block_sparse_moe.experts.{e}.w2.weight"].shape == (H, FF)
    print("ok   run_oracle.split_expert_grads: Loom's [E, ...] expert gradients to Hugging Face's names")


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    moe_block_checks(gen)
    tie_checks()
    loom_choice_checks()
    aux_checks(gen)
    model_checks(gen)
    driver_checks()
    if check.failed:
        print("FAILED")
        sys.exit(1)
    print("all checks pass")


if __name__ == "__main__":
    main()
