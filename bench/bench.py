"""Whole-iteration training throughput of Loom against this machine's limit and against PyTorch.

For each model Loom trains with `loomrun` (synthetic tokens; one rank with T BLAS threads, or
the demo's 4 ranks on the demo's cluster) and PyTorch (Debian's python3-torch, T threads)
trains the same model on the same global batch, in the same run: the oracle's independent
GPT-2 and LLaMA (tests/oracle), PyTorch's AdamW, gradient clipping at 1.0. Both sides time the
whole iteration (forward, backward, gradient sync, clipping, optimizer; Loom's logged
"elapsed time per iteration" is Megatron's interval time, the wall time from one log line to
the next, so it also covers data, reports and logging), several iterations after a warm-up;
printed: the shapes, tokens/s (median over the timed iterations, with the slowest and fastest),
model FLOP/s (the PTD-P count: 6 N + attention per token, no recomputation), MFU against the
sgemm peak (the better of OpenBLAS and oneDNN, measured before and after the models, the better
of the two: this VM's speed drifts), and Loom / PyTorch. Then Loom's step by phase,
from its trace (`loomrun --trace`): GEMMs, attention, other compute, optimizer, communication
not hidden behind compute, and idle time, per step and rank. A benchmark, not a test.

PyTorch 1.13 (Debian 12's) has no fused attention on CPU: its attention is the oracle's
matmul-softmax-matmul over the full S x S (the causal half included), as a user of that
version would write it. Both run without dropout (the configs bench.py writes for Loom have none,
nor has the demo's; the oracle's models have none). Both run under MALLOC_ENV (below).

usage: bench.py --bin DIR --sgemm-peak BIN [--threads 2] [--models a,b] [--precisions fp32,bf16] [--quick]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))
from gpt_oracle import Gpt2  # noqa: E402
from intervals import minus_length, union  # noqa: E402
from llama_oracle import Llama  # noqa: E402
from mixtral_oracle import Mixtral  # noqa: E402

# name: (architecture, layers, hidden, heads, kv heads, ffn, seq, vocab, micro-batch, global batch)
MODELS = {
    "gpt-tiny": ("GPT", 4, 64, 4, 4, 256, 32, 1000, 8, 8),
    "gpt2-small": ("GPT", 12, 768, 12, 12, 3072, 1024, 50257, 1, 1),
    "llama-tiny": ("LLAMA", 4, 64, 4, 2, 176, 32, 1000, 8, 8),
    # ~110M parameters: LLaMA's layout at GPT-2 small's width (grouped-query attention, 3 KV heads).
    "llama-100m": ("LLAMA", 12, 768, 12, 3, 2048, 1024, 32000, 1, 1),
    # A small Mixtral: 8 SwiGLU experts of ffn 352 in every layer, top-2, dropless (MOE below).
    "mixtral-small": ("LLAMA", 4, 256, 8, 4, 352, 256, 8000, 4, 8),
}
# Mixture-of-experts models: (experts, top-k). Both sides route the same way (softmax, top-k
# renormalised, the load-balancing loss at 0.02): Loom's moe instructions against the oracle's
# Hugging Face MixtralSparseMoeBlock (a gather, the expert's three GEMMs and an index_add per
# expert). In bf16 Loom's experts run their products on bf16 weights; PyTorch's under autocast.
# Loom's bf16 GEMM makes one oneDNN matmul per tile shape and an expert's row count changes every
# micro-batch, so its first iterations pay for new shapes: a short run understates Loom bf16 on
# a MoE (mixtral-small alone, 2026-12-08: bf16 about fp32's time in iterations 3-10, 1.2-1.3x
# faster from iteration 21 on).
MOE = {"mixtral-small": (8, 2)}
AUX_COEF = 0.02
DEMO = "demo"  # the README demo's model on its 4-rank cluster (examples/)
DEMO_MODEL = os.path.join(ROOT, "examples", "models", "llama-demo.pbtxt")  # what `./loom demo` trains
# (warm-up, timed) iterations per model size
ITERATIONS = {"small": (3, 21), "large": (2, 12)}
# The timed iterations come in rounds, each system taking its turn in each round, so that the
# machine's drift (15% within minutes on these VMs) reaches every system; a run whose ratios
# (Loom / PyTorch, Loom bf16 / fp32) differ by more than NOISE_LIMIT between rounds is reported
# as too noisy to count. Three rounds: with two, one round caught in a slow spell of the machine
# moved a run's Loom bf16 / fp32 from ~1.7 to 1.50 (2026-12-07, three GPT-2 small runs: 1.74,
# 1.50, 1.70); with three it holds a third of the iterations, short of the medians.
ROUNDS = 3
NOISE_LIMIT = 1.10


def shape_of(name):
    """The model's shape tuple (MODELS' fields, then (experts, top-k) for a MoE)."""
    if name != DEMO:
        return MODELS[name] + MOE.get(name, ())
    text = open(DEMO_MODEL).read()
    cluster = open(os.path.join(ROOT, "examples", "clusters", "cpu-4-demo.pbtxt")).read()
    field = lambda t, k: int(re.search(rf"\b{k}: (\d+)", t).group(1))  # noqa: E731
    arch = re.search(r"\barchitecture: (\w+)", text).group(1)
    h, heads = field(text, "hidden_size"), field(text, "num_attention_heads")
    kv, ffn = (field(text, "num_key_value_heads"), field(text, "ffn_hidden_size")) if arch == "LLAMA" else (heads, 4 * h)
    return (arch, field(text, "num_layers"), h, heads, kv, ffn, field(text, "seq_length"), field(text, "vocab_size"),
            field(cluster, "micro_batch_size"), field(cluster, "global_batch_size"))


def demo_layout():
    cluster = open(os.path.join(ROOT, "examples", "clusters", "cpu-4-demo.pbtxt")).read()
    size = lambda k: (re.search(rf"\b{k}_parallel_size: (\d+)", cluster) or [None, "1"])[1]  # noqa: E731
    return f"t={size('tensor')}, p={size('pipeline')}, d={size('data')}"


def flops_per_token(shape):
    # PTD-P section 5.1 generalised: 3 x (2 x GEMM weights + 4 s h per layer + 2 h V), no recomputation.
    arch, layers, h, heads, kv, ffn, seq, vocab = shape[:8]
    per_layer = 12 * h * h if arch == "GPT" else 2 * h * h + 2 * h * kv * (h // heads) + 3 * h * ffn
    if len(shape) > 10:  # MoE: the router and the top-k experts a token runs
        experts, k = shape[10:12]
        per_layer += h * experts + (k - 1) * 3 * h * ffn
    return 3 * (2 * per_layer * layers + 4 * seq * layers * h + 2 * h * vocab)


def flops_per_step(layers, hidden, seq, vocab, batch):
    # A GPT step's PTD-P count, 72 B s l h^2 (1 + s / 6h + V / 12 l h) (tools/gpu/torch_gpt_bench.py).
    return batch * seq * flops_per_token(("GPT", layers, hidden, 1, 1, 4 * hidden, seq, vocab))


def describe(name, shape, threads):
    arch, layers, h, heads, kv, ffn, seq, vocab, mb, gb = shape[:10]
    where = f"4 ranks ({demo_layout()}, 1 thread each) on examples/clusters/cpu-4-demo.pbtxt" if name == DEMO else \
        f"1 rank, {threads} threads"
    kvs = f", {kv} KV heads, ffn {ffn}" if arch == "LLAMA" else ""
    if len(shape) > 10:
        kvs += f", {shape[10]} experts (top-{shape[11]}, dropless) in every layer"
    return (f"{name}: {arch} {layers} layers, hidden {h}, {heads} heads{kvs}, seq {seq}, vocabulary {vocab}, "
            f"global batch {gb} (micro-batch {mb}); Loom: {where}; PyTorch: 1 process, {threads} threads")


def spread(times):
    return statistics.median(times), min(times), max(times)


# The cluster spec's precision policy (protos/cluster.proto) per benchmarked precision.
PRECISION_FIELD = {"fp32": "PRECISION_FP32", "bf16": "PRECISION_BF16"}


def loom_compile(args, name, shape, work, precision):
    """Plans for the model at `precision`; returns (plans, ranks, threads)."""
    arch, layers, h, heads, kv, ffn, seq, vocab, mb, gb = shape[:10]
    cluster = os.path.join(work, f"{name}-{precision}-cluster.pbtxt")
    if name == DEMO:
        model = DEMO_MODEL
        text = open(os.path.join(ROOT, "examples", "clusters", "cpu-4-demo.pbtxt")).read()
        ranks, threads = 4, 1
    else:
        model = os.path.join(work, name + ".pbtxt")
        with open(model, "w") as f:
            f.write(f'name: "{name}"\narchitecture: {arch}\nnum_layers: {layers}\nhidden_size: {h}\n'
                    f"num_attention_heads: {heads}\nseq_length: {seq}\nvocab_size: {vocab}\n")
            if arch == "LLAMA":
                f.write(f"num_key_value_heads: {kv}\nffn_hidden_size: {ffn}\n")
            if len(shape) > 10:
                f.write(f"num_experts: {shape[10]}\nnum_experts_per_tok: {shape[11]}\nrouter_aux_loss_coef: {AUX_COEF}\n")
        text = (f'name: "one"\nnodes: 1\ndevices_per_node: 1\ndevice {{ kind: CPU }}\n'
                f"parallel {{ micro_batch_size: {mb} global_batch_size: {gb} }}\n")
        ranks, threads = 1, args.threads
    with open(cluster, "w") as f:
        f.write(text.replace("parallel {", f"parallel {{\n  precision: {PRECISION_FIELD[precision]}", 1))
    plans = os.path.join(work, f"plans-{name}-{precision}")
    subprocess.run([os.path.join(args.bin, "loomc"), "compile", model, "--cluster", cluster, "--out", plans, "--quiet"],
                   check=True)
    return plans, ranks, threads


def loom_run(args, compiled, trace, warmup, timed):
    plans, ranks, threads = compiled
    out = subprocess.run([os.path.join(args.bin, "loomrun"), "--nproc", str(ranks), "--plans", plans, "--threads",
                          str(threads), "--steps", str(warmup + timed), "--trace", trace], check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    times = [float(x) / 1e3 for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", out)]
    if len(times) != warmup + timed:
        sys.exit(f"bench.py: expected {warmup + timed} iteration times from loomrun, got {len(times)}:\n{out}")
    return times[warmup:], [os.path.join(trace, f"rank_{r}.json") for r in range(ranks)]


def torch_model(shape):
    arch, layers, h, heads, kv, ffn, seq, vocab, mb, gb = shape[:10]
    torch.manual_seed(0)
    w = {}
    if arch == "GPT":
        w = {"transformer.wte.weight": torch.randn(vocab, h) * 0.02, "transformer.wpe.weight": torch.randn(seq, h) * 0.02,
             "transformer.ln_f.weight": torch.ones(h), "transformer.ln_f.bias": torch.zeros(h)}
        for i in range(layers):
            p = f"transformer.h.{i}."
            for ln in ("ln_1", "ln_2"):
                w[p + ln + ".weight"], w[p + ln + ".bias"] = torch.ones(h), torch.zeros(h)
            for n, (i_, o) in {"attn.c_attn": (h, 3 * h), "attn.c_proj": (h, h), "mlp.c_fc": (h, 4 * h),
                               "mlp.c_proj": (4 * h, h)}.items():
                w[p + n + ".weight"], w[p + n + ".bias"] = torch.randn(i_, o) * 0.02, torch.zeros(o)
        return Gpt2(w, layers, heads)
    hd = h // heads
    w = {"model.embed_tokens.weight": torch.randn(vocab, h) * 0.02, "model.norm.weight": torch.ones(h),
         "lm_head.weight": torch.randn(vocab, h) * 0.02}
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = torch.ones(h), torch.ones(h)
        for n, (o, i_) in {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv * hd, h), "self_attn.v_proj": (kv * hd, h),
                           "self_attn.o_proj": (h, h)}.items():
            w[p + n + ".weight"] = torch.randn(o, i_) * 0.02
        if len(shape) > 10:  # Hugging Face's MixtralSparseMoeBlock names
            moe = p + "block_sparse_moe."
            w[moe + "gate.weight"] = torch.randn(shape[10], h) * 0.02
            for e in range(shape[10]):
                for n, (o, i_) in {"w1": (ffn, h), "w3": (ffn, h), "w2": (h, ffn)}.items():
                    w[f"{moe}experts.{e}.{n}.weight"] = torch.randn(o, i_) * 0.02
        else:
            for n, (o, i_) in {"mlp.gate_proj": (ffn, h), "mlp.up_proj": (ffn, h), "mlp.down_proj": (h, ffn)}.items():
                w[p + n + ".weight"] = torch.randn(o, i_) * 0.02
    config = {"num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": layers,
              "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    if len(shape) > 10:
        config.update(num_local_experts=shape[10], num_experts_per_tok=shape[11], router_aux_loss_coef=AUX_COEF)
        return Mixtral(w, config)
    return Llama(w, config)


def torch_run(args, shape, warmup, timed, precision):
    """PyTorch's iterations; bf16: the forward and the loss under CPU autocast (bf16 GEMMs,
    fp32 weights, gradients and optimizer: torch's own mixed precision)."""
    arch, layers, h, heads, kv, ffn, seq, vocab, mb, gb = shape[:10]
    torch.set_num_threads(args.threads)
    model = torch_model(shape)
    params = list(model.parameters().values())
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tokens, labels = torch.randint(0, vocab, (gb, seq)), torch.randint(0, vocab, (gb, seq))
    mask = torch.ones(gb, seq)
    times = []
    for _ in range(warmup + timed):
        t0 = time.perf_counter()
        opt.zero_grad()
        # Micro-batches of Loom's size, gradients accumulated: the same GEMM shapes on both sides.
        for b in range(0, gb, mb):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = model.loss(tokens[b:b + mb], labels[b:b + mb], mask[b:b + mb])
            (loss.float() * (mb / gb)).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return times[warmup:]


GEMM = {"linear", "weight_grad", "moe", "moe_grad"}  # moe: the experts' GEMMs with their routing
ATTENTION = {"attention", "attention_grad", "grouped_attention", "grouped_attention_grad"}
PHASES = ["GEMM", "attention", "other compute", "optimizer", "exposed communication", "idle"]


def breakdown(trace_files, warmup, timed):
    # Per rank: the steps end where an optimizer event is followed by another program's; the
    # window is the timed steps. Phases in ms per step, averaged over ranks.
    sums = {p: 0.0 for p in PHASES}
    for path in trace_files:
        events = sorted((e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"), key=lambda e: e["ts"])
        ends = [e["ts"] + e["dur"] for e, nxt in zip(events, events[1:] + [None])
                if e["args"]["program"] == "optimizer" and (nxt is None or nxt["args"]["program"] != "optimizer")]
        if len(ends) < warmup + timed:
            sys.exit(f"bench.py: {path}: found {len(ends)} steps in the trace, expected {warmup + timed}")
        lo, hi = ends[warmup - 1] if warmup else events[0]["ts"], ends[warmup + timed - 1]
        window = [e for e in events if lo <= e["ts"] < hi]
        compute = [e for e in window if e["cat"] == "compute"]
        for e in compute:
            phase = "optimizer" if e["args"]["program"] == "optimizer" else \
                "GEMM" if e["name"] in GEMM else "attention" if e["name"] in ATTENTION else "other compute"
            sums[phase] += e["dur"]
        busy = union([[e["ts"], e["ts"] + e["dur"]] for e in compute])
        comm = [[e["ts"], e["ts"] + e["dur"]] for e in window if e["cat"] != "compute"]
        sums["exposed communication"] += minus_length(comm, busy)
        sums["idle"] += (hi - lo) - sum(b - a for a, b in busy) - minus_length(comm, busy)
    scale = 1e-3 / (timed * len(trace_files))  # us -> ms per step and rank
    return {p: v * scale for p, v in sums.items()}


# glibc hands every freed block above its mmap threshold (at most 32 MiB) back to the kernel,
# so each new tensor of that size page-faults all over again. PyTorch allocates its activations
# op by op: on this VM that alone made its GPT-2 small step 2-3x slower (aten::div over the
# 12 x 1024 x 1024 scores: 128 ms, 58 ms with the setting below). PyTorch's CPU performance
# guide has users preload jemalloc or tcmalloc for this; glibc's own thresholds do the same.
# Both systems run under it (Loom allocates nothing inside its step, so it changes nothing
# there): the comparison is against a PyTorch set up as its guide says.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 32), "MALLOC_TRIM_THRESHOLD_": str(2 ** 36)}
# Some machine images pin OpenBLAS to an older kernel (this project's development machine sets
# OPENBLAS_CORETYPE=Haswell, AVX2, for old OpenBLAS builds that fail on newer processors).
# PyTorch's matmul runs on OpenBLAS here, so the benchmark lets OpenBLAS pick its own kernel, as
# on a machine without the pin: PyTorch at its best (Debian's OpenBLAS 0.3.21 passes the
# oracle tests with its own choice). Loom's GEMMs are oneDNN's and do not read these.
OPENBLAS_PINS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def main():
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()) or any(k in os.environ for k in OPENBLAS_PINS):
        env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_PINS}
        os.execve(sys.executable, [sys.executable] + sys.argv, {**env, **MALLOC_ENV})
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--sgemm-peak", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="gpt-tiny,gpt2-small,llama-tiny,llama-100m,mixtral-small,demo")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    ap.add_argument("--precisions", default="fp32,bf16",
                    help="fp32 and/or bf16 (Loom: the cluster's precision policy; PyTorch: CPU autocast)")
    args = ap.parse_args()
    def sgemm_peak(when):
        """The best library's sgemm rate (FLOP/s); prints each library's."""
        out = subprocess.run([args.sgemm_peak, "--threads", str(args.threads)], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        rates = [(float(rate), library, kernel) for rate, library, kernel in
                 (line.split("\t") for line in out.splitlines())]
        print(f"machine: sgemm peak with {args.threads} threads {when}: " +
              ", ".join(f"{library} ({kernel}) {rate:.1f} GFLOP/s" for rate, library, kernel in rates), flush=True)
        return max(rate for rate, _, _ in rates) * 1e9

    before = sgemm_peak("before the models")
    precisions = args.precisions.split(",")
    if any(p not in PRECISION_FIELD for p in precisions):
        sys.exit(f"bench.py: unknown precision in '{args.precisions}' (expected fp32, bf16)")
    results = []
    with tempfile.TemporaryDirectory() as work:
        for name in args.models.split(","):
            if name != DEMO and name not in MODELS:
                sys.exit(f"bench.py: unknown model '{name}' (expected {', '.join(list(MODELS) + [DEMO])})")
            shape = shape_of(name)
            tokens = shape[9] * shape[6]
            model_precisions = precisions
            warmup, timed = ITERATIONS["large" if shape[2] * shape[6] >= 2 ** 17 else "small"]
            if args.quick:
                warmup, timed = 1, 2
            per_round = max(1, timed // ROUNDS)
            print(f"\n{describe(name, shape, args.threads)}; {ROUNDS} rounds of {per_round} timed iterations after "
                  f"{warmup}, the systems taking turns each round", flush=True)
            compiled = {p: loom_compile(args, name, shape, work, p) for p in model_precisions}
            times = {}  # (system, precision) -> [per-round lists of seconds]
            traces = {}
            for r in range(ROUNDS):
                for p in model_precisions:
                    trace = os.path.join(work, f"trace-{name}-{p}-{r}")
                    loom, traces[p] = loom_run(args, compiled[p], trace, warmup, per_round)
                    times.setdefault(("Loom", p), []).append(loom)
                    times.setdefault(("PyTorch", p), []).append(torch_run(args, shape, warmup, per_round, p))
            print(f"  {'system':13} {'tokens/s':>9} {'(slowest..fastest)':>20} {'spread':>7} {'GFLOP/s':>8} "
                  f"{'of sgemm peak':>13}")
            rates = {}
            for (system, p), rounds in times.items():
                all_times = [t for round_times in rounds for t in round_times]
                med, fast, slow = spread(all_times)
                rates[(system, p)] = tokens / med
                gflops = rates[(system, p)] * flops_per_token(shape) / 1e9
                print(f"  {system + ' ' + p:13} {tokens / med:9.0f} {f'({tokens / slow:.0f}..{tokens / fast:.0f})':>20} "
                      f"{100 * (slow - fast) / med:6.0f}% {gflops:8.1f} {100 * gflops * 1e9 / before:12.1f}%")
            ratios = {p: rates[("Loom", p)] / rates[("PyTorch", p)] for p in model_precisions}
            line = "  Loom / PyTorch (whole iterations, medians): " + ", ".join(f"{p} {r:.2f}" for p, r in ratios.items())
            if "bf16" in model_precisions and "fp32" in model_precisions:
                line += f"; Loom bf16 / Loom fp32 = {rates[('Loom', 'bf16')] / rates[('Loom', 'fp32')]:.2f}"
            print(line)
            # Each ratio per round (both sides measured minutes apart): the drift the two share cancels.
            def round_ratios(a, b):
                return [statistics.median(tb) / statistics.median(ta) for ta, tb in zip(times[a], times[b])]
            pairs = {f"Loom/PyTorch {p}": round_ratios(("Loom", p), ("PyTorch", p)) for p in model_precisions}
            if "bf16" in model_precisions and "fp32" in model_precisions:
                pairs["Loom bf16/fp32"] = round_ratios(("Loom", "bf16"), ("Loom", "fp32"))
            print("  per round: " + "; ".join(f"{k} " + ", ".join(f"{r:.2f}" for r in v) for k, v in pairs.items()) +
                  "; medians (ms): " + "; ".join(f"{sy} {p} " + ", ".join(f"{statistics.median(t) * 1e3:.0f}" for t in r)
                                                 for (sy, p), r in times.items()))
            noisy = [k for k, v in pairs.items() if max(v) > NOISE_LIMIT * min(v)]
            if noisy:
                print(f"  NOISY: per-round ratios differ by more than {100 * (NOISE_LIMIT - 1):.0f}% ({', '.join(noisy)}): "
                      f"do not count this run's ratios")
            else:
                print(f"  steady: every ratio within {100 * (NOISE_LIMIT - 1):.0f}% from round to round")
            for p in model_precisions:
                phases = breakdown(traces[p], warmup, per_round)
                step = sum(phases.values())
                print(f"  Loom {p} step by phase (ms per step and rank, from the last round's trace): " +
                      ", ".join(f"{ph} {v:.1f} ({100 * v / step:.0f}%)" for ph, v in phases.items()), flush=True)
            results.append((name, ratios, rates, bool(noisy)))
    print()
    after = sgemm_peak("after the models")
    peak = max(before, after)
    print(f"machine: the MFU's limit (the best library, before or after): {peak / 1e9:.1f} GFLOP/s")
    def summary(name, ratios, rates, noisy):
        parts = [f"Loom/PyTorch {p} {r:.2f}" for p, r in ratios.items()]
        parts += [f"Loom {p} {100 * rates[('Loom', p)] * flops_per_token(shape_of(name)) / peak:.1f}% of the sgemm peak"
                  for p in ratios]
        return f"{name} " + ", ".join(parts) + (" (NOISY)" if noisy else "")
    print("summary: " + "; ".join(summary(*r) for r in results))

if __name__ == "__main__":
    main()
