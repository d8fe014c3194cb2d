"""An independent Mixtral in PyTorch: the oracle Loom's mixture-of-experts training is checked
against.

Written from Hugging Face's MixtralForCausalLM (modeling_mixtral.py: MixtralSparseMoeBlock and
load_balancing_loss_func) and its config.json, with its parameter names and nn.Linear [out, in]
layout. Everything but the MLP is the LLaMA of llama_oracle.py (attention, RMSNorm, rotary
embeddings, embedding and output layer, cross-entropy): Mixtral subclasses it and replaces the
MLP of each MoE layer, one whose weights are named

    model.layers.{i}.block_sparse_moe.gate.weight          [E, H]  the router (no bias)
    model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight [F, H]  expert e's gate projection
    model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight [F, H]  its up projection
    model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight [H, F]  its down projection

(a layer with LLaMA's mlp.gate_proj instead stays a dense LLaMA MLP: Megatron-Core's
--moe-layer-freq). The MoE block, on the normalised hidden h [B, S, H] flattened to T tokens:

- router logits h gate^T; probabilities softmax(logits) in fp32; each token's k experts of the
  k largest probabilities (largest first, ties to the lower expert: a stable sort, where
  torch.topk leaves ties unspecified); their probabilities renormalised to sum 1 (Mixtral).
- capacity (config capacity_factor > 0; absent or 0: dropless): each expert keeps at most
  C = ceil(capacity_factor * T * k / E) of the (token, slot) assignments routed to it, those of
  the largest renormalised weight, ties to the lower token (Megatron-Core's "probs" drop
  policy). A dropped assignment adds nothing to its token's output; the kept weights are not
  renormalised again.
- expert e: w2(silu(w1 x) * w3 x) on its kept tokens, each token's output the sum over its kept
  slots of weight * expert output (index_add, as Hugging Face does).
- the layer's load-balancing loss (load_balancing_loss_func on this layer's logits alone, from
  all top-k assignments before any drop): E * sum_e (count_e / T) * P_e, count_e the
  assignments to expert e, P_e the mean over tokens of e's probability. Its gradient flows
  through P only.

The training objective is ce + router_aux_loss_coef * (sum of the MoE layers' losses): each
layer's loss on its own (Megatron-Core), where Hugging Face concatenates the layers' logits
into one. Nothing here imports or mirrors Loom's code.
"""
import math

import torch
import torch.nn.functional as F

from llama_oracle import Llama


class Mixtral(Llama):
    # precision: as Llama's (the attention and the dense layers round as there). The MoE block
    # rounds each op's output, as Megatron-Core's bf16 experts store them: the router logits,
    # the renormalised weights, the gate and up projections, silu(gate) * up, the down
    # projection and each weighted output; the softmax in fp32 as Hugging Face's.
    def __init__(self, weights, config, precision="fp32"):
        super().__init__(weights, config, precision)
        self.experts = config["num_local_experts"]
        self.top_k = config["num_experts_per_tok"]
        self.aux_coef = config.get("router_aux_loss_coef", 0.0)
        self.capacity_factor = config.get("capacity_factor") or 0.0
        self._layers = None  # while losses() runs: each MoE layer's (aux, dropped, assigned)
        # The smallest margin of any routing decision since it was last reset (run_oracle sets it
        # to inf): between a token's k-th and (k+1)-th probability, and between the last kept and
        # the first dropped weight of an expert over capacity. Below the runs' rounding
        # differences, two correct implementations may decide differently.
        self.min_gap = float("inf")
        # 16-bit runs (run_oracle.py): Loom's own choices for the micro-batch at hand, {layer:
        # int tensor [T * k]} (loom-rank --dump-routing), and the probability margin below which
        # either choice is right. A token whose choice differs from Loom's by less takes Loom's
        # (two 16-bit runs round the logits apart: near a tie they may route either way); one
        # that differs by more is a mismatch, listed here.
        # With a capacity factor, Loom's kept assignments likewise ({layer: int tensor [T * k]},
        # the dropped -1): an expert keeps Loom's where the two differ only among weights within
        # tie_margin of its last kept weight (rounded weights tie often; near a tie either is right).
        self.loom_routing, self.loom_kept, self.tie_margin = None, None, 0.0
        self.routing_mismatches = []
        self.routing_adopted = 0  # tokens that took Loom's choice
        self.kept_adopted = 0  # experts over capacity that kept Loom's assignments

    def capacity(self, tokens):
        """The assignments an expert keeps of a micro-batch of `tokens` tokens (None: dropless)."""
        if self.capacity_factor <= 0:
            return None
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.experts)

    def route(self, logits, layer=None, batch=1):
        """(probs [T, E] fp32, weights [T, k] renormalised, experts [T, k]) of router logits [T, E]."""
        probs = logits.float().softmax(-1)
        top, experts = probs.sort(dim=-1, descending=True, stable=True)  # ties: the lower expert
        if self.top_k < top.shape[-1]:  # how near a token came to another choice (run_oracle's tie check)
            self.min_gap = min(self.min_gap, (top[:, self.top_k - 1] - top[:, self.top_k]).min().item())
        top, experts = top[:, : self.top_k], experts[:, : self.top_k]
        if self.loom_routing is not None and self.top_k < probs.shape[-1]:
            experts = self.near_ties_as_loom(probs, experts, layer, batch)
            top = probs.gather(1, experts)
        return probs, top / top.sum(-1, keepdim=True), experts

    def near_ties_as_loom(self, probs, experts, layer, batch):
        """experts [T, k] with each token whose choice differs from Loom's only among experts
        within tie_margin of its k-th probability given Loom's choice (in Loom's order). Loom's
        choices of a sequence-parallel run come as the tp ranks' parts, each its slice of every
        one of the `batch` samples' sequences."""
        if layer not in self.loom_routing:
            self.routing_mismatches.append(f"layer {layer}: no routing from Loom")
            return experts
        loom = self.loom_routing[layer]
        if isinstance(loom, list):
            loom = torch.cat([part.long().view(batch, -1, self.top_k) for part in loom], 1)
        loom = loom.long().view(experts.shape)
        out = experts.clone()
        differ = (experts.sort(1).values != loom.sort(1).values).any(1)
        for t in differ.nonzero().flatten().tolist():
            p = probs[t]
            kth = p[experts[t]].min()
            swapped = set(experts[t].tolist()) ^ set(loom[t].tolist())
            worst = max(abs(p[e] - kth).item() for e in swapped)
            if worst < self.tie_margin:
                out[t] = loom[t]
                self.routing_adopted += 1
            else:
                self.routing_mismatches.append(f"layer {layer} token {t}: Loom chose {loom[t].tolist()}, the oracle "
                                               f"{experts[t].tolist()} (probabilities {worst:.1e} apart)")
        return out

    def aux_loss(self, probs, experts):
        """The load-balancing loss of one layer from all its top-k assignments (experts [T, k]):
        E * sum_e (count_e / T) * P_e; the counts are constants."""
        T, E = probs.shape
        count = F.one_hot(experts, E).sum((0, 1)).to(probs.dtype)  # [E], no gradient
        return E * ((count / T) * probs.mean(0)).sum()

    def kept(self, weights, experts, e, capacity, layer=None):
        """(tokens, slots) of the assignments to expert e that it keeps, in token order."""
        tok, slot = torch.where(experts == e)  # row-major: tokens ascending (one slot per token)
        if capacity is not None and tok.numel() > capacity:
            w = weights.detach()[tok, slot]
            order = w.sort(dim=0, descending=True, stable=True).indices  # ties: lower token
            self.min_gap = min(self.min_gap, (w[order[capacity - 1]] - w[order[capacity]]).item())
            keep = order[:capacity].sort().values
            if self.loom_kept is not None:
                keep = self.near_ties_kept_as_loom(tok, w, keep, w[order[capacity - 1]].item(), e, layer)
            tok, slot = tok[keep], slot[keep]
        return tok, slot

    def near_ties_kept_as_loom(self, tok, w, keep, last, e, layer):
        """keep (indices into tok, the tokens routed to expert e, w their weights) as Loom's kept
        assignments when the two differ only among weights within tie_margin of `last`, the
        oracle's last kept weight; otherwise the oracle's, and the difference listed."""
        if layer not in self.loom_kept:
            self.routing_mismatches.append(f"layer {layer}: no kept assignments from Loom")
            return keep
        loom = self.loom_kept[layer].long().view(-1, self.top_k)
        loom_tokens = set((loom == e).any(1).nonzero().flatten().tolist())
        mine = set(tok[keep].tolist())
        if loom_tokens == mine:
            return keep
        position = {t: i for i, t in enumerate(tok.tolist())}
        swapped = mine ^ loom_tokens
        if not loom_tokens <= position.keys() or len(loom_tokens) != len(mine):
            self.routing_mismatches.append(f"layer {layer} expert {e}: Loom kept {len(loom_tokens)} assignments, "
                                           f"{len(loom_tokens - position.keys())} of them not routed to it here")
            return keep
        worst = max(abs(w[position[t]].item() - last) for t in swapped)
        if worst >= self.tie_margin:
            self.routing_mismatches.append(f"layer {layer} expert {e}: Loom kept tokens {sorted(loom_tokens - mine)} "
                                           f"in place of {sorted(mine - loom_tokens)} (weights {worst:.1e} from the "
                                           f"last kept one)")
            return keep
        self.kept_adopted += 1
        return torch.tensor(sorted(position[t] for t in loom_tokens), dtype=keep.dtype)

    def moe(self, p, pre, h):
        """The MoE block of the layer whose names start with pre on h [B, S, H] (p: the weights
        the ops read): (output [B, S, H], the layer's load-balancing loss, assignments dropped,
        assignments made)."""
        r, E = self.r, self.experts
        moe = pre + "block_sparse_moe."
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        T = x.shape[0]
        layer = int(pre.split(".")[2])
        probs, weights, experts = self.route(r(x @ p[moe + "gate.weight"].t()), layer=layer, batch=shape[0])
        aux = self.aux_loss(probs, experts)
        weights = r(weights)
        capacity = self.capacity(T)
        out = torch.zeros_like(x)
        kept = 0
        for e in range(E):
            tok, slot = self.kept(weights, experts, e, capacity, layer=layer)
            kept += tok.numel()
            if tok.numel() == 0:
                continue
            xe = x[tok]
            gate = r(xe @ p[f"{moe}experts.{e}.w1.weight"].t())
            up = r(xe @ p[f"{moe}experts.{e}.w3.weight"].t())
            y = r(r(r(F.silu(gate) * up) @ p[f"{moe}experts.{e}.w2.weight"].t()) * weights[tok, slot, None])
            out = out.index_add(0, tok, y)
        assigned = T * self.top_k
        return r(out).reshape(shape), aux, assigned - kept, assigned

    def mlp(self, p, pre, h):
        if pre + "mlp.gate_proj.weight" in p:  # a dense layer
            return super().mlp(p, pre, h)
        y, aux, dropped, assigned = self.moe(p, pre, h)
        if self._layers is not None:
            self._layers.append((aux, dropped, assigned))
        return y

    def losses(self, tokens, labels, loss_mask):
        """(ce, aux_sum, dropped, assigned): the mean cross-entropy over the unmasked tokens, the
        sum of the MoE layers' load-balancing losses (a tensor with its gradient, not scaled by
        the coefficient), and the (token, slot) assignments dropped for capacity and made, over
        all MoE layers (ints)."""
        self._layers = []
        try:
            ce = self.cross_entropy(self.logits(tokens), labels, loss_mask)
            layers = self._layers
        finally:
            self._layers = None
        aux = sum((a for a, _, _ in layers), torch.zeros((), dtype=torch.float32))
        return ce, aux, sum(d for _, d, _ in layers), sum(n for _, _, n in layers)

    def loss(self, tokens, labels, loss_mask):
        """The training objective: ce + router_aux_loss_coef * aux_sum."""
        ce, aux, _, _ = self.losses(tokens, labels, loss_mask)
        return ce + self.aux_coef * aux
