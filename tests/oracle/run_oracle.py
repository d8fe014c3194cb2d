"""The equivalence oracle: Loom, in every parallel configuration, against an independent
PyTorch GPT (gpt_oracle.py), step after step.

For each configuration: `loomc compile` the model, `loomrun` it for k steps from the initial
weights (exported at step 0) with dropout 0, dumping the batches it used, its step-1
gradients and its per-step losses, and exporting the final weights. The oracle loads the
same initial weights and batches, runs the same AdamW steps (warm-up/cosine learning rate,
gradient clipping at 1, no weight decay on 1-D parameters) and compares: the loss at every
step (relative difference < 1e-5 at step 1, < 1e-4 after), every gradient at step 1 and every
parameter after k steps (relative L2 error < 1e-4).

A LLaMA-family model with num_experts (Mixtral-style mixture of experts) is checked against
mixtral_oracle.py: the training objective ce + router_aux_loss_coef * (the MoE layers'
load-balancing losses), the loss compared with Loom's log its cross-entropy part.

A BERT (architecture: BERT; the export's config.json naming MegatronBertForPreTraining) is
checked against bert_oracle.py: the objective mlm + sop (Megatron's pretrain_bert), each batch
file's whole dict (tokens, token_types, attention_mask, labels, loss_mask, sop_labels, sop_mask)
fed to it, Loom's step-1 gradients (its own names and layouts) mapped to Hugging Face's by
bert_oracle.loom_grads_to_hf. fp32, bf16 or fp16; no context or expert parallelism.

usage: run_oracle.py --bin DIR --model MODEL.pbtxt|MODEL.mlir --work DIR [--heads N] [--steps 10] [--configs NAME,...]

MODEL may be Transformer IR (a GPT in the builder's parameter names, without dropout): it is
compiled as it is, so only the configurations with its vocabulary run.
       [--mutant-check]   (with --bin holding loomc-mutant as loomc: checks that the broken rule is caught)
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import torch

from bert_oracle import MegatronBert, loom_grads_to_hf
from gpt_oracle import Gpt2, read_safetensors
from llama_oracle import Llama
from mixtral_oracle import Mixtral

# (t, p, d, v, micro-batches m, schedule, recompute, vocab[, zero1[, sequence parallel[, grad_reduce_in_bf16[,
#  devices per node[, tp_comm_overlap[, context parallel c[, cp_comm_type[, expert parallel ep]]]]]]]])
# grad_reduce_in_bf16 (the dp reduction moving bf16) is a bf16 plan's option: those
# configurations run with --precision bf16 only. Devices per node (default: all ranks on one
# node) smaller than a stage's ranks puts neighbouring stages on different nodes, where the
# pipeline messages take PTD-P's scatter/gather (each tp rank sends 1/t, all-gathered on arrival).
# tp_comm_overlap runs the GEMMs that feed a tp all-reduce in row blocks, each block's
# all-reduce overlapping the next block's GEMM; with sequence parallelism the all-gathers and
# reduce-scatters beside their GEMMs sample by sample. Context parallelism (c) cuts each sample's
# sequence into 2c chunks, rank i holding chunks i and 2c-1-i; the reference sees whole samples.
# Attention meets the other chunks round a ring (cp_comm_type p2p, the default) or by an
# all-gather of the keys and values ("all_gather"). Expert parallelism (ep, MoE models only) is
# carved out of the data-parallel ranks (Megatron-Core): it does not multiply the world.
CONFIGS = {
    "t1p1d1": (1, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000),
    "t2p1d1": (2, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000),
    "t4p1d1": (4, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000),
    "t1p2d1-1f1b": (1, 2, 1, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000),
    "t1p2d1-gpipe": (1, 2, 1, 1, 2, "GPIPE", "RECOMPUTE_NONE", 1000),
    "t1p4d1-1f1b": (1, 4, 1, 1, 4, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000),
    "t1p4d1-gpipe": (1, 4, 1, 1, 4, "GPIPE", "RECOMPUTE_NONE", 1000),
    "t1p1d2": (1, 1, 2, 1, 1, "", "RECOMPUTE_NONE", 1000),
    "t1p1d4": (1, 1, 4, 1, 1, "", "RECOMPUTE_NONE", 1000),
    "t2p2d1-1f1b": (2, 2, 1, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000),
    "t2p2d1-gpipe": (2, 2, 1, 1, 2, "GPIPE", "RECOMPUTE_NONE", 1000),
    "t2p1d2": (2, 1, 2, 1, 1, "", "RECOMPUTE_NONE", 1000),
    "t1p2d2-1f1b": (1, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000),
    "t2p2d2-1f1b": (2, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000),
    "t1p2d1v2-interleaved": (1, 2, 1, 2, 2, "INTERLEAVED_ONE_F_ONE_B", "RECOMPUTE_NONE", 1000),
    "t2p2d1-recompute-full": (2, 2, 1, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_FULL", 1000),
    "t1p1d1-accumulate-m4": (1, 1, 1, 1, 4, "", "RECOMPUTE_NONE", 1000),
    "t4p1d1-odd-vocab": (4, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 997),
    "t2p2d1-odd-vocab": (2, 2, 1, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 997),
    "t1p1d2-zero1": (1, 1, 2, 1, 1, "", "RECOMPUTE_NONE", 1000, True),
    "t2p2d2-zero1": (2, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, True),
    "t1p2d2v2-interleaved-zero1": (1, 2, 2, 2, 2, "INTERLEAVED_ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, True),
    # ZeRO-1 gathering each bucket right after its update instead of in the next forward (see
    # PARALLEL_EXTRA): in a 16-bit plan only the 16-bit copies, so the export's fp32 masters come
    # from parameter_gather.
    "t1p2d2-zero1-gather-in-optimizer": (1, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, True),
    "t2p1d1-sequence-parallel": (2, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000, False, True),
    "t4p1d1-sequence-parallel-odd-vocab": (4, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 997, False, True),
    "t2p2d2-sequence-parallel-zero1": (2, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, True, True),
    "t1p1d4-grad-reduce-bf16": (1, 1, 4, 1, 1, "", "RECOMPUTE_NONE", 1000, False, False, True),
    "t2p2d2-zero1-grad-reduce-bf16": (2, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, True, False, True),
    "t2p2d1-scatter-gather": (2, 2, 1, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, False, False, False, 2),
    "t2p2d1v2-interleaved-scatter-gather": (2, 2, 1, 2, 2, "INTERLEAVED_ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, False,
                                            False, False, 2),
    "t2p2d2-zero1-scatter-gather": (2, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_FULL", 1000, True, False, False, 4),
    "t2p1d1-tp-overlap": (2, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000, False, False, False, 0, True),
    "t2p2d2-tp-overlap-recompute-full": (2, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_FULL", 1000, False, False, False, 0,
                                         True),
    "t2p1d1-sequence-parallel-tp-overlap": (2, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000, False, True, False, 0, True),
    "t4p1d1-sequence-parallel-tp-overlap-odd-vocab": (4, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 997, False, True, False, 0,
                                                      True),
    "t2p2d2-sequence-parallel-zero1-tp-overlap": (2, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_FULL", 1000, True, True, False,
                                                  0, True),
    "t1p1d1c2": (1, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000, False, False, False, 0, False, 2),
    "t1p1d1c4": (1, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000, False, False, False, 0, False, 4),
    "t2p1d1c2": (2, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000, False, False, False, 0, False, 2),
    "t1p2d1c2-1f1b": (1, 2, 1, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, False, False, False, 0, False, 2),
    "t1p1d2c2-zero1": (1, 1, 2, 1, 1, "", "RECOMPUTE_NONE", 1000, True, False, False, 0, False, 2),
    "t2p1d1c2-sequence-parallel": (2, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000, False, True, False, 0, False, 2),
    "t2p2d1c2-recompute-full": (2, 2, 1, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_FULL", 1000, False, False, False, 0, False, 2),
    "t1p1d1c2-all-gather": (1, 1, 1, 1, 1, "", "RECOMPUTE_NONE", 1000, False, False, False, 0, False, 2, "all_gather"),
    "t2p2d1c2-all-gather": (2, 2, 1, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, False, False, False, 0, False, 2,
                            "all_gather"),
    "t1p1d2c4-all-gather-zero1": (1, 1, 2, 1, 1, "", "RECOMPUTE_NONE", 1000, True, False, False, 0, False, 4,
                                  "all_gather"),
    # Expert parallelism (MoE models only): the ep group carved out of d.
    "t1p1d2e2": (1, 1, 2, 1, 1, "", "RECOMPUTE_NONE", 1000, False, False, False, 0, False, 1, "", 2),
    "t1p1d4e2": (1, 1, 4, 1, 1, "", "RECOMPUTE_NONE", 1000, False, False, False, 0, False, 1, "", 2),
    "t1p1d4e4": (1, 1, 4, 1, 1, "", "RECOMPUTE_NONE", 1000, False, False, False, 0, False, 1, "", 4),
    "t2p2d2e2-1f1b": (2, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, False, False, False, 0, False, 1, "", 2),
    "t1p2d2e2-interleaved": (1, 2, 2, 2, 2, "INTERLEAVED_ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, False, False, False, 0,
                             False, 1, "", 2),
    # Sequence parallelism with expert parallelism: each tp rank routes its slice of the sequence
    # to the ep members, the load-balancing statistics summed over tp.
    "t2p1d2e2-sequence-parallel": (2, 1, 2, 1, 1, "", "RECOMPUTE_NONE", 1000, False, True, False, 0, False, 1, "", 2),
    "t2p2d4e2-sequence-parallel-zero1-recompute": (2, 2, 4, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_FULL", 1000, True, True,
                                                   False, 0, False, 1, "", 2),
    # ZeRO-1 with ep: the experts' buckets sharded over the d / ep ranks holding them (one part at
    # d = ep: no collective), the rest's over d.
    "t1p1d4e2-zero1": (1, 1, 4, 1, 1, "", "RECOMPUTE_NONE", 1000, True, False, False, 0, False, 1, "", 2),
    "t1p1d2e2-zero1": (1, 1, 2, 1, 1, "", "RECOMPUTE_NONE", 1000, True, False, False, 0, False, 1, "", 2),
    "t2p2d2e2-zero1": (2, 2, 2, 1, 2, "ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, True, False, False, 0, False, 1, "", 2),
    "t1p2d4e2v2-interleaved-zero1": (1, 2, 4, 2, 2, "INTERLEAVED_ONE_F_ONE_B", "RECOMPUTE_NONE", 1000, True, False,
                                     False, 0, False, 1, "", 2),
}
# Cluster fields beyond the tuple's, by configuration.
PARALLEL_EXTRA = {"t1p2d2-zero1-gather-in-optimizer": "overlap_param_gather: false"}
# The representative subset CI runs (the full matrix: --configs all); for the LLaMA family
# (llama-tiny: 2 KV heads, split for t = 2, replicated for t = 4) its own.
CI_CONFIGS = ["t1p1d1", "t2p1d1", "t4p1d1-odd-vocab", "t1p2d1-1f1b", "t1p2d1-gpipe", "t1p1d2", "t2p2d1-1f1b",
              "t2p1d2", "t1p2d2-1f1b", "t2p2d2-1f1b", "t1p2d1v2-interleaved", "t2p2d1-recompute-full",
              "t1p1d1-accumulate-m4", "t2p2d2-zero1", "t2p1d1-sequence-parallel",
              "t2p2d2-sequence-parallel-zero1", "t2p2d1-scatter-gather", "t2p2d1v2-interleaved-scatter-gather",
              "t2p1d1-tp-overlap", "t2p1d1-sequence-parallel-tp-overlap", "t1p1d1c2", "t2p1d1c2",
              "t1p2d1c2-1f1b", "t1p1d1c2-all-gather"]
LLAMA_CI_CONFIGS = ["t1p1d1", "t2p1d1", "t4p1d1-odd-vocab", "t1p2d1-1f1b", "t2p2d1-1f1b", "t1p1d2", "t2p1d2",
                    "t1p2d1v2-interleaved", "t2p2d1-recompute-full", "t2p2d2-zero1", "t2p1d1-sequence-parallel",
                    "t4p1d1-sequence-parallel-odd-vocab", "t2p2d1-scatter-gather", "t2p1d1-tp-overlap",
                    "t2p1d1-sequence-parallel-tp-overlap", "t1p1d1c2", "t2p1d1c2", "t1p2d1c2-1f1b",
                    "t1p1d2c2-zero1", "t1p1d1c2-all-gather"]
# Mixture of experts (a LLaMA model with num_experts): t, p, d and ZeRO-1 layouts, and expert
# parallelism ep = 2 and 4 alone and with t, p, interleaving, ZeRO-1 and sequence parallelism
# (dropless: a capacity with sequence parallelism is refused); context parallelism is refused for
# MoE for now.
MOE_CI_CONFIGS = ["t1p1d1", "t2p1d1", "t1p2d1-1f1b", "t1p1d2", "t2p2d1-1f1b", "t2p2d2-zero1", "t1p1d1-accumulate-m4",
                  "t2p2d1-recompute-full", "t1p2d1v2-interleaved", "t1p1d2e2", "t1p1d4e2", "t1p1d4e4",
                  "t2p2d2e2-1f1b", "t1p2d2e2-interleaved", "t1p1d4e2-zero1", "t2p2d2e2-zero1",
                  "t2p1d1-sequence-parallel", "t2p1d2e2-sequence-parallel", "t2p2d4e2-sequence-parallel-zero1-recompute"]
# BERT (bert-tiny: padded samples, the sentence-order head): t, p, d, interleaving, recompute,
# accumulation, ZeRO-1, sequence parallelism and scatter/gather; context parallelism is refused
# for BERT (padding masks), and expert parallelism is MoE's.
BERT_CI_CONFIGS = ["t1p1d1", "t2p1d1", "t4p1d1-odd-vocab", "t1p2d1-1f1b", "t1p2d1-gpipe", "t1p1d2", "t2p2d1-1f1b",
                   "t2p2d2-1f1b", "t1p2d1v2-interleaved", "t2p2d1-recompute-full", "t1p1d1-accumulate-m4",
                   "t2p2d2-zero1", "t2p1d1-sequence-parallel", "t2p2d2-sequence-parallel-zero1",
                   "t2p2d1-scatter-gather"]
MICRO_BATCH, LR, MIN_LR, WARMUP = 2, 3e-3, 3e-4, 3
# Adam's epsilon: with Megatron's 1e-8, the rounding noise of gradients that are zero in exact
# arithmetic (the attention key bias: softmax ignores a constant shift) becomes full-size
# steps of random sign, different in any two fp32 implementations (even Loom on one rank
# against itself with another summation order). 1e-6 keeps such noise below the tolerance, so
# only real differences count.
ADAM_EPS = 1e-6
# Mixture of experts: a routing decision (top-k, or an expert's capacity) whose margin is below
# this may fall either way between two fp32 runs whose parameters differ by the fp32 tolerance
# (logits about 1e-6 apart); the oracle then compares up to the step before (check_config).
# 16-bit runs are not cut short: their logits differ by 16-bit rounding (1e-3), so in any two
# 16-bit runs some of every step's tokens near a tie route differently, and an expert's step-1
# gradient, a sum of many tokens' terms of either sign, moves by about 1 / sqrt(tokens) per
# token (mixtral-tiny in bf16: Loom's bf16 and fp32 step-1 gradients of single experts 10-19%
# apart). So a 16-bit check reads Loom's choices (loom-rank --dump-routing) and its oracles
# (the 16-bit one and the fp32 yardstick) take Loom's choice for a token whose own differs from
# it only among experts within TIE_MARGIN of its k-th probability; a choice that differs by more
# is a failure. With a capacity factor, likewise for the assignments an expert keeps: Loom's
# kept ones (the dump's) are taken where the two differ only among weights within TIE_MARGIN
# of the expert's last kept weight.
ROUTING_TIE = 1e-6
TIE_MARGIN = {"bf16": 2.0 ** -6, "fp16": 2.0 ** -8}


def batch_position(path):
    """(dp rank, micro-batch) of a dumped batch file (batch_stepSSSSS_dpDDD_mbMMMM.safetensors)."""
    m = re.search(r"_dp(\d+)_mb(\d+)\.safetensors$", path)
    return int(m.group(1)), int(m.group(2))


def loom_routing(directory, step, sp_split):
    """Loom's MoE choices of one step (loom-rank --dump-routing): {(dp, micro-batch): (chosen,
    kept)}, each {layer: int tensor [B * S * k]}; kept (the assignments an expert's capacity kept,
    the dropped ones -1) is there only with a capacity factor. Each tp rank routes the whole
    micro-batch, or with sequence parallelism (sp_split = t) its t-th of each sample's sequence:
    then a list of the tp ranks' parts, in order (Mixtral.near_ties_as_loom puts each sample's
    sequence back together; a capacity with sequence parallelism is refused)."""
    parts = {}
    for path in glob.glob(os.path.join(directory, f"routing_step{step:05d}_rank*.safetensors")):
        tensors, meta = read_safetensors(path)
        tp, dp = int(meta["tp_rank"]), int(meta["dp_rank"])
        for key, experts in tensors.items():
            layer, mb, kept = re.match(r"layer(-?\d+)_mb(\d+)(_kept)?$", key).groups()
            parts.setdefault((dp, int(mb)), ({}, {}))[1 if kept else 0].setdefault(int(layer), {})[tp] = experts
    def joined(by_tp):
        return by_tp[min(by_tp)] if sp_split == 1 else [by_tp[r] for r in sorted(by_tp)]
    return {position: tuple({layer: joined(by_tp) for layer, by_tp in kind.items()} for kind in kinds)
            for position, kinds in parts.items()}


def moe_capacity_factor(path):
    """A model config's capacity_factor (0: dropless, or not an MoE config)."""
    m = re.search(r"^\s*capacity_factor:\s*([0-9.eE+-]+)", open(path).read(), re.M)
    return float(m.group(1)) if m else 0.0


def ir_vocab(path):
    """The vocabulary of a GPT given as IR (its cross-entropy's valid_vocab); the oracle needs it
    without dropout."""
    text = open(path).read()
    if "loom.dropout" in text or re.search(r"\bdropout = [1-9]", text):
        raise SystemExit(f"{path}: the oracle compares runs without dropout; the IR has dropout")
    m = re.search(r"valid_vocab = (\d+)", text)
    if not m:
        raise SystemExit(f"{path}: no loom.cross_entropy with valid_vocab")
    return int(m.group(1))


def model_config(path, vocab, work):
    if path.endswith(".mlir"):  # IR is compiled as it is
        return path
    out = os.path.join(work, f"model-{vocab}.pbtxt")
    with open(path) as f, open(out, "w") as g:
        for line in f:
            if line.startswith(("vocab_size", "hidden_dropout", "attention_dropout", "micro_batch_size")):
                continue
            g.write(line)
        g.write(f"vocab_size: {vocab}\nhidden_dropout: 0\nattention_dropout: 0\n")
    return out


# bf16 (--precision bf16): Loom's bf16 plan against the oracle rounding at the same points
# (gpt_oracle.Bf16Round). The two round the same values but sum in other orders (GEMMs, the
# softmax, gradient accumulation), and a bf16 ulp is 2^-8: bounds of relative 2e-3 on the loss,
# 3e-2 on each step-1 gradient and 1e-2 on all the parameters together after the steps (fp32:
# 1e-4, each parameter). Measured on gpt-tiny: at most 1.5e-4, 1.1e-2 and 3.3e-3. (Loom's fp32
# run is nearly as close to this oracle: these bounds show bf16 training is right, not that it
# rounds; runtime_test checks that a bf16 plan's losses differ from the fp32 plan's.) A tensor
# whose 16-bit gradient is less precise than that (BERT's pooler and sentence-order head, fed by
# a few [CLS] rows: in a 4-layer, hidden-96 BERT the oracle's bf16 gradients of them are
# 1.7-4.3e-2 from its fp32 ones, and Loom's t = 1 and t = 2 runs 4.5e-2 from each other) may be
# as far from the oracle as twice the oracle's own distance from its fp32 gradient; and a step's
# loss as far as twice the oracle's 16-bit loss from the same training in fp32 (the oracle
# without rounding, run beside it on the same batches): where AdamW's sign-like steps on such
# noisy gradients part the trajectories, Loom's from the oracle's as the oracle's from fp32's.
# The parameters after the steps likewise (mixtral-tiny: the oracle's bf16 parameters are
# 1.6e-2 from its fp32 ones, Loom's 1.4e-2 from Loom's fp32: tokens near a routing tie go to
# other experts in each 16-bit run, and the experts' down projections move by 7-14%).
#
# fp16 (--precision fp16): Loom's fp16 plan (dynamic loss scaling, its scale per iteration in
# the loss log) against the oracle rounding to fp16 at the same points, its loss times the same
# scale (so the gradients it rounds are the scaled ones, as Loom's are) and the gradients
# divided by it before clipping; Loom's fp16 attention computes in fp32 between fp16 tensors,
# and so does the oracle's. An fp16 ulp is 2^-11: the bounds are bf16's over 4 (measured on
# gpt-tiny and llama-tiny: see docs/progress.md). An iteration Loom skips (its gradients
# overflowed) must overflow in the oracle too, which back-propagates each data- and
# context-parallel rank's share as that rank does (below).
PRECISION = "fp32"
TOLERANCE = {"fp32": {"loss1": 1e-5, "loss": 1e-4, "grad": 1e-4, "params": 1e-4},
             "bf16": {"loss1": 2e-3, "loss": 2e-3, "grad": 3e-2, "params": 1e-2},
             "fp16": {"loss1": 5e-4, "loss": 5e-4, "grad": 7.5e-3, "params": 2.5e-3}}
CLUSTER_PRECISION = {"bf16": "PRECISION_BF16", "fp16": "PRECISION_FP16"}


# Data-parallel buckets (all-reduce, and ZeRO-1's reduce-scatter and parameter all-gather) of
# at most 40 kB of fp32 gradients: several per stage even for the tiny models.
DP_BUCKET_BYTES = 40000


def cluster_config(name, t, p, d, v, m, schedule, recompute, work, zero1=False, sp=False, bf16_reduce=False,
                   per_node=0, tp_overlap=False, cp=1, cp_comm="", ep=1):
    out = os.path.join(work, name + ".pbtxt")
    sched = f"schedule: {schedule}" if schedule else ""
    if PRECISION in CLUSTER_PRECISION:
        sched += " precision: " + CLUSTER_PRECISION[PRECISION]
    if bf16_reduce:
        sched += " grad_reduce_in_bf16: true"
    if tp_overlap:
        sched += " tp_comm_overlap: true"
    if cp > 1:
        sched += f" context_parallel_size: {cp}"
    if cp_comm:
        sched += f' cp_comm_type: "{cp_comm}"'
    if ep > 1:  # carved out of d: the world stays t * p * d * cp
        sched += f" expert_parallel_size: {ep}"
    if name in PARALLEL_EXTRA:
        sched += " " + PARALLEL_EXTRA[name]
    with open(out, "w") as f:
        per_node = per_node or t * p * d * cp
        f.write(f'name: "{name}"\nnodes: {t * p * d * cp // per_node}\ndevices_per_node: {per_node}\ndevice {{ kind: CPU }}\n'
                f"parallel {{ tensor_parallel_size: {t} pipeline_parallel_size: {p} data_parallel_size: {d} "
                f"virtual_pipeline_size: {v} micro_batch_size: {MICRO_BATCH} global_batch_size: {MICRO_BATCH * m * d} "
                f"recompute: {recompute} {sched} zero1: {'true' if zero1 else 'false'} "
                f"dp_bucket_size_bytes: {DP_BUCKET_BYTES} "
                f"sequence_parallel: {'true' if sp else 'false'} }}\n")
    return out


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}")
    return r.stdout


def lr_at(it, steps):  # Megatron: linear warm-up, then cosine down to the minimum
    if it <= WARMUP:
        return LR * it / WARMUP
    progress = (it - WARMUP) / (steps - WARMUP)
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1 + math.cos(math.pi * progress))


def loom_to_hf_grad(name, g, vocab, heads):
    """A Loom gradient (Loom layout: padded vocabulary, GPT's QKV grouped per head) in HF layout."""
    if name in ("transformer.wte.weight", "model.embed_tokens.weight", "lm_head.weight"):
        return g[:vocab]
    if ".attn.c_attn." in name:
        cols = g.shape[-1]
        hd = cols // (3 * heads)
        return g.reshape(*g.shape[:-1], heads, 3, hd).transpose(-3, -2).reshape(*g.shape[:-1], cols)
    return g


EXPERTS_STACKED = re.compile(r"^(model\.layers\.\d+\.block_sparse_moe\.experts)\.(w[123]\.weight)$")


def split_expert_grads(grads):
    """Loom's stacked expert gradients (model.layers.{i}.block_sparse_moe.experts.w1.weight
    [E, F, H], w3 the same, w2 [E, H, F]) under Hugging Face's per-expert names
    (...experts.{e}.w1.weight [F, H], ...); the other gradients as they are."""
    out = {}
    for name, g in grads.items():
        m = EXPERTS_STACKED.match(name)
        if not m:
            out[name] = g
            continue
        for e in range(g.shape[0]):
            out[f"{m.group(1)}.{e}.{m.group(2)}"] = g[e]
    return out


def job_gradients(dump, world):
    """Assemble the ranks' step-1 gradients (tensor-parallel shards concatenated). The dump is
    taken before the optimizer program, which finishes two syncs: with ZeRO-1 the data-parallel
    replicas hold their own gradients (averaged here), and a pipeline-tied embedding's two
    copies hold their stage's part (summed here)."""
    shards, copies = {}, {}  # name -> shard -> (dim, [per-replica gradients])
    for r in range(world):
        tensors, meta = read_safetensors(os.path.join(dump, f"grads_rank{r}.safetensors"))
        dp_synced = meta.get("__dp_synchronized__", "true") == "true"
        for name, g in tensors.items():
            dim, parts, index = (int(x) for x in meta[name].split(",")[:3])
            key = 0 if dim < 0 else index
            target = shards
            if "tied:" + name in meta:  # the pipeline-tied copy: its part goes to its twin
                target, name = copies, meta["tied:" + name]
            entry = target.setdefault(name, {}).setdefault(key, (dim, []))
            if dp_synced:
                entry[1].clear()  # every replica holds the same
            entry[1].append(g)
    out = {}
    for name, parts in shards.items():
        summed = {}
        for key, (dim, gs) in parts.items():
            g = torch.stack(gs).mean(0)
            if name in copies and key in copies[name]:
                g = g + torch.stack(copies[name][key][1]).mean(0)
            summed[key] = (dim, g)
        dim = next(iter(summed.values()))[0]
        out[name] = summed[0][1] if dim < 0 else torch.cat([summed[i][1] for i in sorted(summed)], dim)
    return out


def trace_problems(trace_dir, world, steps):
    """Each rank's executed collectives (kind@group: count, bytes; loom-rank --trace) against its
    plan's per-step totals times the steps: the runtime runs exactly the plan's collectives."""
    problems = []
    for r in range(world):
        with open(os.path.join(trace_dir, f"rank_{r}.json")) as f:
            trace = json.load(f)
        executed = {}
        for e in trace["traceEvents"]:
            a = e.get("args", {})
            if e.get("ph") != "X" or not a.get("group") or (a["bytes"] == 0 and e["cat"] == "compute"):
                continue
            c = executed.setdefault(f"{e['name']}@{a['group']}", [0, 0])
            c[0] += 1
            c[1] += a["bytes"]
        planned = {k: [v["count"] * steps, v["bytes"] * steps]
                   for k, v in trace["otherData"]["plan_collectives_per_step"].items()}
        if executed != planned:
            problems.append(f"rank {r}: executed collectives {executed} differ from the plan's {planned}")
    return problems


def trace_order_problems(loomc, plans, trace_dir):
    """loomc check --trace: every rank's streams ran the plan's instructions in the order the plan
    semantics gives, events respected; and the check refuses the same trace with rank 0's first two
    compute instructions swapped (so it can fail)."""
    r = subprocess.run([loomc, "check", plans, "--trace", trace_dir], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        return [f"loomc check --trace: {r.stdout.strip()}"]
    swapped = trace_dir + "-swapped"
    shutil.rmtree(swapped, ignore_errors=True)
    shutil.copytree(trace_dir, swapped)
    path = os.path.join(swapped, "rank_0.json")
    with open(path) as f:
        trace = json.load(f)
    compute = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("tid") == 0]
    a, b = compute[0]["args"], compute[1]["args"]
    a["instruction"], b["instruction"] = b["instruction"], a["instruction"]
    with open(path, "w") as f:
        json.dump(trace, f)
    r = subprocess.run([loomc, "check", plans, "--trace", swapped], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode == 0 or "where the plan runs" not in r.stdout:
        return [f"loomc check --trace accepted a trace with two instructions swapped: {r.stdout.strip()}"]
    return []


# The attention's key bias has a gradient of zero in exact arithmetic (softmax ignores a constant
# shift of a row's scores, and q . b_k is one), so alone it compares rounding noise with rounding
# noise. GPT's fused c_attn bias holds it beside the query and value biases; Hugging Face's BERT
# splits the three: they are compared together, as one QKV bias, exactly as GPT's is.
SPLIT_QKV_BIAS = re.compile(r"^(.*\.attention\.self)\.(query|key|value)\.bias$")


def comparison_groups(names):
    """Parameter name -> the group compared as one tensor: each name alone, but the query, key and
    value biases of an attention together."""
    groups = {}
    for k in names:
        m = SPLIT_QKV_BIAS.match(k)
        groups.setdefault(f"{m.group(1)}.(query|key|value).bias" if m else k, []).append(k)
    return groups


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def adamw(params):
    """Megatron's AdamW over the oracle's parameters: weight decay on the matrices only."""
    return torch.optim.AdamW([{"params": [q for q in params.values() if q.dim() >= 2], "weight_decay": 0.1},
                              {"params": [q for q in params.values() if q.dim() < 2], "weight_decay": 0.0}],
                             lr=LR, betas=(0.9, 0.95), eps=ADAM_EPS)


def model_loss(model, batch):
    """A GPT's or LLaMA's loss on a micro-batch, or BERT's objective mlm + sop (as Loom logs it)."""
    if isinstance(model, MegatronBert):
        return model.loss(batch)
    return model.loss(batch["tokens"], batch["labels"], batch["loss_mask"])


def check_config(args, name, cfg, failures):
    t, p, d, v, m, schedule, recompute, vocab = cfg[:8]
    zero1 = len(cfg) > 8 and cfg[8]
    sp = len(cfg) > 9 and cfg[9]
    bf16_reduce = len(cfg) > 10 and cfg[10]
    per_node = cfg[11] if len(cfg) > 11 else 0
    tp_overlap = len(cfg) > 12 and cfg[12]
    cp = cfg[13] if len(cfg) > 13 else 1
    cp_comm = cfg[14] if len(cfg) > 14 else ""
    ep = cfg[15] if len(cfg) > 15 else 1
    world = t * p * d * cp
    moe = getattr(args, "moe", False)
    bert = getattr(args, "bert", False)
    if bf16_reduce and PRECISION != "bf16":
        print(f"skip {name:28} (grad_reduce_in_bf16: a bf16 plan's option; run with --precision bf16)", flush=True)
        return False
    if bert and cp > 1:
        print(f"skip {name:28} (BERT: context parallelism is refused)", flush=True)
        return False
    if moe and cp > 1:
        print(f"skip {name:28} (MoE: context parallelism not supported yet)", flush=True)
        return False
    if moe and sp and moe_capacity_factor(args.model) > 0:
        print(f"skip {name:28} (MoE with a capacity factor: sequence parallelism is refused)", flush=True)
        return False
    if ep > 1 and not moe:
        print(f"skip {name:28} (expert parallelism: mixture-of-experts models only)", flush=True)
        return False
    if args.model.endswith(".mlir") and vocab != ir_vocab(args.model):
        print(f"skip {name:28} (the IR's vocabulary is {ir_vocab(args.model)}, this configuration's {vocab})", flush=True)
        return False
    work = os.path.join(args.work, name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model = model_config(args.model, vocab, work)
    plans = os.path.join(work, "plans")
    run([os.path.join(args.bin, "loomc"), "compile", model, "--cluster",
         cluster_config(name, t, p, d, v, m, schedule, recompute, work, zero1, sp, bf16_reduce, per_node,
                        tp_overlap, cp, cp_comm, ep), "--out", plans,
         "--quiet"])
    loomrun = [os.path.join(args.bin, "loomrun"), "--nproc", str(world), "--plans", plans, "--seed", "5"]
    init = os.path.join(work, "init.safetensors")
    run(loomrun + ["--steps", "0", "--export", init])
    started = time.time()
    run(loomrun + ["--steps", str(args.steps), "--lr", str(LR), "--min-lr", str(MIN_LR), "--warmup", str(WARMUP),
                   "--decay-iters", str(args.steps), "--clip-grad", "1.0", "--weight-decay", "0.1",
                   "--adam-eps", str(ADAM_EPS),
                   "--dump-batches", os.path.join(work, "batches"), "--dump-grads", os.path.join(work, "grads"),
                   "--trace", os.path.join(work, "trace"),
                   "--loss-log", os.path.join(work, "loss.log"), "--metrics-file", os.path.join(work, "metrics.jsonl"),
                   "--export", os.path.join(work, "final.safetensors")] +
        (["--dump-routing", os.path.join(work, "routing")] if moe and PRECISION != "fp32" else []))
    seconds = time.time() - started
    if per_node and t > 1 and not sp:  # the layout is here for scatter/gather: it must be in the plan
        with open(os.path.join(work, "trace", "rank_0.json")) as f:
            if '"name":"shard"' not in f.read():
                raise SystemExit(f"{name}: stages on different nodes but rank 0 ran no shard (no scatter/gather)")

    weights, _ = read_safetensors(init)
    # The Hugging Face class named by the config.json written beside the export.
    with open(os.path.join(work, "config.json")) as f:
        hf_config = json.load(f)
    if hf_config.get("architectures") == ["MegatronBertForPreTraining"]:
        make_oracle, heads = (lambda precision: MegatronBert(weights, hf_config, precision)), hf_config["num_attention_heads"]
    elif bert:
        raise RuntimeError(f"a BERT model, but config.json's architectures is {hf_config.get('architectures')}")
    elif hf_config.get("architectures") == ["MixtralForCausalLM"]:
        make_oracle, heads = (lambda precision: Mixtral(weights, hf_config, precision)), hf_config["num_attention_heads"]
    elif hf_config.get("architectures") == ["LlamaForCausalLM"]:
        make_oracle, heads = (lambda precision: Llama(weights, hf_config, precision)), hf_config["num_attention_heads"]
    else:
        layers = 1 + max(int(k.split(".")[2]) for k in weights if k.startswith("transformer.h."))
        heads = args.heads
        make_oracle = lambda precision: Gpt2(weights, layers, heads, precision)  # noqa: E731
    oracle = make_oracle(PRECISION)
    params = oracle.parameters()
    opt = adamw(params)
    # A 16-bit check's yardstick: the same training in fp32 (the oracle without rounding, the
    # same batches, updates and schedule) beside the oracle's 16-bit one.
    exact = make_oracle("fp32") if PRECISION != "fp32" else None
    if exact is not None:
        exact_params = exact.parameters()
        exact_opt = adamw(exact_params)
    # A 16-bit MoE check: both oracles take Loom's routing near a tie (ROUTING_TIE, TIE_MARGIN).
    loom_choices = isinstance(oracle, Mixtral) and PRECISION != "fp32"
    if loom_choices:
        for o in (oracle, exact):
            o.tie_margin = TIE_MARGIN[PRECISION]
    # iteration -> (loss, the loss scale of an fp16 run's iteration, else 1). An fp16 iteration
    # whose gradients overflowed is skipped by Loom (no update, no learning-rate step, the scale
    # halved: Megatron's dynamic loss scaling) and writes no line; the oracle skips it too.
    log = {int(f[0]): (float(f[1]), float(f[3]) if len(f) > 3 else 1.0)
           for f in (line.split() for line in open(os.path.join(work, "loss.log")))}
    if PRECISION != "fp16" and len(log) != args.steps:
        raise RuntimeError(f"{len(log)} iterations in the loss log, expected {args.steps}")
    if not log:
        raise RuntimeError("no iteration in the loss log")
    loom_losses = [log[it][0] for it in sorted(log)]
    scale_now = 65536.0 if PRECISION == "fp16" else 1.0  # loomrun's --initial-loss-scale default
    problems = trace_problems(os.path.join(work, "trace"), world, args.steps)
    problems += trace_order_problems(os.path.join(args.bin, "loomc"), plans, os.path.join(work, "trace"))
    worst_loss = 0.0
    updates = 0
    moe_dropped = moe_assigned = 0  # the oracle's (token, slot) assignments over all steps
    tie_step, before_tie = 0, None
    # Loom's logged MoE statistics per iteration (the load-balancing loss per MoE layer run, the
    # fraction of assignments dropped), checked against the oracle's.
    metrics = {}
    if isinstance(oracle, Mixtral):
        with open(os.path.join(work, "metrics.jsonl")) as f:
            metrics = {m["iteration"]: m for m in map(json.loads, f)}
        moe_layers = len({k.split(".")[2] for k in weights if k.endswith("block_sparse_moe.gate.weight")})
    for step in range(args.steps):
        batches = sorted(glob.glob(os.path.join(work, "batches", f"batch_step{step:05d}_*.safetensors")))
        if len(batches) != d * m:
            problems.append(f"step {step + 1}: {len(batches)} batch files, expected {d * m}")
            break
        opt.zero_grad()
        total = 0.0
        skipped = step + 1 not in log
        if isinstance(oracle, Mixtral):
            oracle.min_gap = float("inf")
            step_aux, step_dropped, step_assigned = 0.0, 0, 0
        scale = scale_now if skipped else log[step + 1][1]
        # Each data-parallel rank back-propagates its own micro-batches' loss over m, and each
        # context-parallel rank its own tokens' mean (cp times its share of the sequence's), the
        # d x cp ranks' gradients averaged after the backward (Megatron's DDP; its CP loss times
        # cp): the 16-bit values the oracle rounds are those of the loss times d cp, its
        # gradients divided by d cp after. (Exact in fp32 and for powers of two; what it changes
        # is where fp16 overflows.)
        backprop_scale = scale * d * cp
        routing = loom_routing(os.path.join(work, "routing"), step, t if sp else 1) if loom_choices else {}
        for path in batches:
            b, _ = read_safetensors(path)
            if loom_choices:
                oracle.loom_routing, oracle.loom_kept = routing.get(batch_position(path), ({}, {}))
            if isinstance(oracle, Mixtral):
                # The objective ce + coef * aux; Loom logs the cross-entropy part.
                ce, aux, dropped, assigned = oracle.losses(b["tokens"], b["labels"], b["loss_mask"])
                loss = (ce + oracle.aux_coef * aux) / len(batches)
                (loss * backprop_scale).backward()
                total += ce.item() / len(batches)
                moe_dropped, moe_assigned = moe_dropped + dropped, moe_assigned + assigned
                step_aux, step_dropped, step_assigned = (step_aux + aux.item(), step_dropped + dropped,
                                                         step_assigned + assigned)
                continue
            loss = model_loss(oracle, b) / len(batches)
            (loss * backprop_scale).backward()
            total += loss.item()
        if isinstance(oracle, Mixtral) and PRECISION == "fp32" and oracle.min_gap < ROUTING_TIE:
            # A routing decision this close may fall the other way in Loom (its fp32 sums run in
            # other orders): from this step on the two runs may route a token differently, both
            # correctly. Compared instead: the losses before it, and the parameters before it
            # (Loom run again for the steps before the tie).
            tie_step, before_tie = step + 1, {k: q.detach().clone() for k, q in params.items()}
            break
        if skipped:
            finite = all(bool(torch.isfinite(q.grad).all()) for q in params.values())
            print(f"   iteration {step + 1}: skipped by Loom (inf/NaN gradients at loss scale {scale:g}); the "
                  f"oracle's gradients at that scale {'are finite' if finite else 'overflow too'}", flush=True)
            if finite:
                problems.append(f"iteration {step + 1}: Loom's gradients overflowed at loss scale {scale:g}, "
                                "the oracle's are finite")
            scale_now = scale / 2
            continue
        scale_now = scale
        if backprop_scale != 1.0:
            for q in params.values():
                q.grad /= backprop_scale
        exact_total = None
        if exact is not None:
            exact_opt.zero_grad()
            exact_total = 0.0
            for path in batches:
                b, _ = read_safetensors(path)
                if isinstance(exact, Mixtral):  # the objective, and its cross-entropy part as `total`
                    exact.loom_routing, exact.loom_kept = routing.get(batch_position(path), ({}, {}))
                    ce, aux, _, _ = exact.losses(b["tokens"], b["labels"], b["loss_mask"])
                    ((ce + exact.aux_coef * aux) / len(batches)).backward()
                    exact_total += ce.item() / len(batches)
                    continue
                loss = model_loss(exact, b) / len(batches)
                loss.backward()
                exact_total += loss.item()
        if step == 0:
            # Loom's main gradients as dumped hold the loss scale (fp16): unscaled here.
            loom_grads = {k: g / scale
                          for k, g in split_expert_grads(job_gradients(os.path.join(work, "grads"), world)).items()}
            if isinstance(oracle, MegatronBert):
                # Loom's BERT names and layouts -> Hugging Face's (an unknown name is an error);
                # loom_to_hf_grad below leaves these names as they are.
                try:
                    loom_grads = loom_grads_to_hf(loom_grads, hf_config)
                except ValueError as e:
                    raise RuntimeError(str(e))
            absent = [k for k in params if k not in loom_grads]
            if absent:
                raise RuntimeError(f"no step-1 gradient from Loom for {', '.join(absent[:5])}"
                                   f"{' ...' if len(absent) > 5 else ''}")
            if args.verbose:
                errs = sorted((rel(loom_to_hf_grad(k, loom_grads[k], vocab, heads), q.grad), k) for k, q in params.items())
                print(f"   step-1 gradients: median rel {errs[len(errs) // 2][0]:.2e}, worst {errs[-1][0]:.2e} ({errs[-1][1]})")
            got_grads = {}
            for k, q in params.items():
                got = loom_to_hf_grad(k, loom_grads[k], vocab, heads)
                if got.shape != q.grad.shape:
                    problems.append(f"step-1 gradient of {k}: shape {tuple(got.shape)}, expected {tuple(q.grad.shape)}")
                    continue
                got_grads[k] = got
            # A 16-bit gradient is as precise as its tensor lets it be: the oracle's own distance
            # from its fp32 run measures that, and Loom, rounding the same values in other orders
            # (another layout's partial sums, another GEMM's), may be twice as far from the oracle.
            for group, names in comparison_groups(got_grads).items():
                got = torch.cat([got_grads[k].flatten() for k in names])
                want = torch.cat([params[k].grad.flatten() for k in names])
                bound = TOLERANCE[PRECISION]["grad"]
                if exact is not None:
                    bound = max(bound, 2 * rel(want, torch.cat([exact_params[k].grad.flatten() for k in names])))
                if rel(got, want) >= bound:
                    problems.append(f"step-1 gradient of {group}: relative error {rel(got, want):.2e}" +
                                    (f" (bound {bound:.2e})" if exact is not None else ""))
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        updates += 1
        for group in opt.param_groups:
            group["lr"] = lr_at(updates, args.steps)
        opt.step()
        tol = TOLERANCE[PRECISION]["loss1" if step == 0 else "loss"]
        if exact is not None:
            torch.nn.utils.clip_grad_norm_(list(exact_params.values()), 1.0)
            for group in exact_opt.param_groups:
                group["lr"] = lr_at(updates, args.steps)
            exact_opt.step()
            # The losses likewise: as far as twice the oracle's own 16-bit loss from its fp32 one.
            tol = max(tol, 2 * abs(total - exact_total) / abs(total))
        if isinstance(oracle, Mixtral):
            logged = metrics.get(step + 1, {})
            want_aux = step_aux / (moe_layers * len(batches))
            got_aux, got_dropped = logged.get("load_balancing_loss"), logged.get("moe-dropped-fraction")
            if got_aux is None or abs(got_aux - want_aux) >= tol * abs(want_aux):
                problems.append(f"load-balancing loss at step {step + 1}: Loom {got_aux}, oracle {want_aux:.9g}")
            if got_dropped is None or abs(got_dropped - step_dropped / step_assigned) > 1e-9:
                problems.append(f"dropped fraction at step {step + 1}: Loom {got_dropped}, oracle "
                                f"{step_dropped / step_assigned:.9g}")
        diff = abs(log[step + 1][0] - total) / abs(total)
        worst_loss = max(worst_loss, diff)
        if diff >= tol:
            problems.append(f"loss at step {step + 1}: Loom {log[step + 1][0]:.9g}, oracle {total:.9g} "
                            f"(relative {diff:.2e}" + (f", bound {tol:.2e})" if exact is not None else ")"))
    if loom_choices and args.verbose:
        print(f"   routing: {oracle.routing_adopted} tokens took Loom's choice near a tie, {oracle.kept_adopted} "
              f"experts over capacity kept Loom's assignments ({exact.routing_adopted} and {exact.kept_adopted} in "
              f"the fp32 yardstick, {len(exact.routing_mismatches)} beyond the margin there: "
              f"{exact.routing_mismatches[:1]})", flush=True)
    if isinstance(oracle, Mixtral) and oracle.routing_mismatches:
        problems.append(f"{len(oracle.routing_mismatches)} routing choices differ from Loom's beyond the "
                        f"{TIE_MARGIN[PRECISION]:g} margin, the first: {oracle.routing_mismatches[0]}")
    compared = args.steps
    final, _ = read_safetensors(os.path.join(work, "final.safetensors"))
    if tie_step:
        compared = tie_step - 1
        print(f"   routing near-tie at step {tie_step} (a margin of {oracle.min_gap:.1e}): compared through step "
              f"{compared}", flush=True)
        if compared < 1:
            problems.append("a routing near-tie at step 1: nothing to compare (another seed or model)")
            compared = 1
        else:
            run(loomrun + ["--steps", str(compared), "--lr", str(LR), "--min-lr", str(MIN_LR), "--warmup", str(WARMUP),
                           "--decay-iters", str(args.steps), "--clip-grad", "1.0", "--weight-decay", "0.1",
                           "--adam-eps", str(ADAM_EPS), "--export", os.path.join(work, "before-tie", "final.safetensors")])
            final, _ = read_safetensors(os.path.join(work, "before-tie", "final.safetensors"))
            for k, q in before_tie.items():
                params[k].data.copy_(q)
    if args.verbose:
        for k in sorted(params, key=lambda k: -rel(final[k], params[k].detach()))[:8]:
            print(f"   {k:45} rel {rel(final[k], params[k].detach()):.2e} |ref| {params[k].detach().norm():.3e}")
    worst = max(rel(torch.cat([final[k].flatten() for k in names]), torch.cat([params[k].detach().flatten() for k in names]))
                for names in comparison_groups(params).values())
    if PRECISION != "fp32":
        # 16-bit rounding noise, amplified by AdamW where gradients are small (biases, zero-
        # initialised, move by about lr per step whatever the gradient's size), leaves single
        # small parameters a few percent apart even between two bf16 implementations; all the
        # parameters together are compared instead.
        def distance(a, b):
            num = sum(float((a[k] - q.detach()).pow(2).sum()) for k, q in b.items())
            return math.sqrt(num / sum(float(q.detach().pow(2).sum()) for q in b.values()))
        worst = distance(final, params)
    params_bound = TOLERANCE[PRECISION]["params"]
    if exact is not None and not tie_step:
        # As the losses: as far as twice the oracle's own 16-bit parameters from its fp32 ones.
        params_bound = max(params_bound, 2 * distance({k: q.detach() for k, q in exact_params.items()}, params))
    if args.verbose and exact is not None:
        print(f"   parameters after {compared} steps: relative error {worst:.2e}, bound {params_bound:.2e}", flush=True)
    if worst >= params_bound:
        groups = comparison_groups(params)
        bad = "all of them" if PRECISION != "fp32" else max(
            groups, key=lambda g: rel(torch.cat([final[k].flatten() for k in groups[g]]),
                                      torch.cat([params[k].detach().flatten() for k in groups[g]])))
        problems.append(f"parameters after {compared} steps: {bad} relative error {worst:.2e}" +
                        (f" (bound {params_bound:.2e})" if exact is not None else ""))
    status = "ok  " if not problems else "FAIL"
    dropped = f"  MoE: {moe_dropped} of {moe_assigned} assignments dropped" if isinstance(oracle, Mixtral) else ""
    print(f"{status} {name:28} ranks {world}  loss {loom_losses[0]:.6f} -> {loom_losses[-1]:.6f}  "
          f"worst parameter error {worst:.1e}, loss {worst_loss:.1e}  ({seconds:.1f} s){dropped}", flush=True)
    for pr in problems[:5]:
        print("       " + pr, flush=True)
    if problems:
        failures.append(name)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="directory with loomc and loomrun")
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--configs", default="ci", help="ci | all | comma-separated names")
    ap.add_argument("--mutant-check", action="store_true",
                    help="--bin holds a Loom built with a deliberately broken rule (loomc-mutant: the row-parallel "
                         "all-reduce dropped): t1p1d1 must still match and t2p1d1 must fail")
    ap.add_argument("--verbose", action="store_true",
                    help="also print the step-1 gradients' errors and the parameters furthest from the oracle")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="bf16 / fp16: Loom's 16-bit plans against the oracle rounding at the same points")
    args = ap.parse_args()
    global PRECISION
    PRECISION = args.precision
    text = open(args.model).read()
    # Mixture of experts: a LLaMA model (architecture: LLAMA) with num_experts > 0, or IR with MoE ops.
    args.moe = bool(re.search(r"^\s*num_experts:\s*[1-9]", text, re.M)) or "loom.moe_" in text
    if args.mutant_check:
        failures = []
        check_config(args, "t1p1d1", CONFIGS["t1p1d1"], failures)
        check_config(args, "t2p1d1", CONFIGS["t2p1d1"], failures)
        if failures == ["t2p1d1"]:
            print("mutant check: the broken rule is caught (t2p1d1 fails, t1p1d1 unaffected)")
            sys.exit(0)
        print(f"mutant check FAILED: expected exactly t2p1d1 to fail, got {failures or 'no failure'}")
        sys.exit(1)
    llama = "architecture: LLAMA" in text or "loom.grouped_attention" in text
    args.bert = bool(re.search(r"^\s*architecture:\s*BERT\b", text, re.M))
    ci = (MOE_CI_CONFIGS if args.moe else LLAMA_CI_CONFIGS if llama else BERT_CI_CONFIGS if args.bert
          else CI_CONFIGS)
    names = ci if args.configs == "ci" else list(CONFIGS) if args.configs == "all" else args.configs.split(",")
    failures, skipped = [], 0
    for name in names:
        try:
            skipped += 0 if check_config(args, name, CONFIGS[name], failures) else 1
        except RuntimeError as e:
            print(f"FAIL {name}: {e}", flush=True)
            failures.append(name)
    ran = len(names) - skipped
    print(f"{ran - len(failures)} of {ran} configurations match the oracle" + (f" ({skipped} skipped)" if skipped else ""))
    if ran == 0:
        failures.append("nothing ran")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
