#!/usr/bin/env python3
"""Loom's planned memory next to Megatron-LM's theoretical memory formula.

For a set of configurations as Megatron runs them (the PTD-P paper's GPT 1.7B to 1T, arXiv:2104.04473
table 1; sequence parallelism without recomputation as Korthikanti et al. 2022, arXiv:2205.05198,
train them; LLaMA-3 8B and 70B), this compiles each with `loomc compile` for A100-SXM4-80GB
devices, reads the first pipeline stage's memory report (`loom-dump --view=memory --json`, rank 0:
the stage Megatron's formula describes) and computes Megatron's figures:

  weights and optimizer: megatron/training/theoretical_memory_usage.py, compute_weight_and_optimizer_memory
  activations:           the same file's compute_activation_memory (sequence parallelism with selective
                         recomputation) and compute_activation_memory_without_sp (everything else)

reimplemented here from the formulas (not copied). Megatron's code has no full-recomputation case (its
fallback formula then counts every layer's whole activations); for full recomputation this uses
Korthikanti et al.'s own figure (section 5, table 2): 2sbh bytes per layer (2sbh/t with sequence
parallelism) kept between the passes, with the same embedding, output-layer and in-flight terms.

Loom differs from Megatron in known ways; each is a stated reason with its bytes, computed for the
configuration, and added to Megatron's figure. A row fails when Loom's figure differs from that
adjusted figure by more than 10%, or when the raw difference has no stated reason. With full
recomputation the workspace (one layer recomputed and its backward) is checked against one layer's
activations (Megatron keeps sbh(10 + 24/t) bytes, 34sbh/t with sequence parallelism, while it
recomputes a layer): at most twice that, the rest being the backward's gradients, which neither
formula counts.

    python3 tests/memory/megatron_memory.py --bin bazel-bin/apps [--markdown] [--only NAME]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

GiB = 1024 ** 3
TOLERANCE = 0.10


def gpt(name, L, h, a, s=2048, V=51200):
    return dict(name=name, arch="GPT", L=L, h=h, a=a, g=a, F=4 * h, s=s, V=V, swiglu=False, tied=True, rms=False)


def llama(name, L, h, a, g, F, s, V):
    return dict(name=name, arch="LLAMA", L=L, h=h, a=a, g=g, F=F, s=s, V=V, swiglu=True, tied=False, rms=True)


# (model, t, p, d, v, b, global batch, recompute, sequence parallel, ZeRO-1)
CONFIGS = [
    (gpt("gpt-1.7b", 24, 2304, 24), 1, 1, 32, 1, 16, 512, True, False, False),
    (gpt("gpt-3.6b", 30, 3072, 32), 2, 1, 32, 1, 16, 512, True, False, False),
    (gpt("gpt-7.5b", 36, 4096, 32), 4, 1, 32, 1, 16, 512, True, False, False),
    (gpt("gpt-18.4b", 40, 6144, 48), 8, 1, 32, 1, 8, 1024, True, False, False),
    (gpt("gpt-39.1b", 48, 8192, 64), 8, 2, 32, 1, 2, 1536, True, False, False),
    (gpt("gpt-76.1b", 60, 10240, 80), 8, 4, 32, 1, 2, 1792, True, False, False),
    (gpt("gpt-145.6b", 80, 12288, 96), 8, 8, 24, 1, 2, 2304, True, False, False),
    (gpt("gpt-310.1b", 96, 16384, 128), 8, 16, 15, 1, 1, 2160, True, False, False),
    (gpt("gpt-529.6b", 105, 20480, 128), 8, 35, 9, 1, 1, 2520, True, False, False),
    (gpt("gpt-1t", 128, 25600, 160), 8, 64, 6, 2, 1, 3072, True, False, False),
    # Korthikanti et al.'s runs: sequence parallelism, no full recomputation (Loom never stores the
    # attention probabilities: Megatron's selective recomputation's memory).
    (gpt("gpt-22b", 48, 6144, 64), 8, 1, 1, 1, 4, 4, False, True, False),
    (gpt("gpt-175b", 96, 12288, 96), 8, 8, 1, 1, 1, 64, False, True, False),
    (gpt("gpt-175b-nosp", 96, 12288, 96), 8, 8, 1, 1, 1, 64, False, False, False),
    (llama("llama-3-8b", 32, 4096, 32, 8, 14336, 8192, 128256), 4, 1, 2, 1, 1, 32, False, True, True),
    (llama("llama-3-70b", 80, 8192, 64, 8, 28672, 8192, 128256), 8, 4, 2, 1, 1, 64, True, True, True),
]


def padded_vocab(V, t, multiple=128):
    step = multiple * t
    return (V + step - 1) // step * step


def megatron_weights(m, t, p, d, zero1):
    """Megatron's weight and optimizer bytes of the first stage (parameters, bytes per parameter)."""
    h, a, g, F, L = m["h"], m["a"], m["g"], m["F"], m["L"]
    V = padded_vocab(m["V"], t)
    kv = h // a
    gamma = 1.5 if m["swiglu"] else 1.0
    n = 1 if m["rms"] else 2
    attention = 2 * a * kv * h + 2 * g * kv * h
    mlp = 2 * h * F * gamma
    norms = 2 * h * n
    tp_part = (L * (attention + mlp) / p + h * V) / t
    replicated = (L * norms + n * h) / p
    params = tp_part + replicated
    if not m["tied"] and p == 1:
        params += h * V / t
    per_param = 6 + 12 / d if zero1 else 18
    return params, params * per_param


def megatron_activations(m, t, p, v, b, microbatches, recompute, sp, masks=True):
    """Megatron's activation bytes of the first stage (its formula; Korthikanti's for full recompute).

    masks=False leaves out the dropout masks the formula counts (1 byte per element)."""
    s, h, L, F = m["s"], m["h"], m["L"], m["F"]
    V = padded_vocab(m["V"], t)
    sbh = s * b * h
    mask = 1 if masks else 0
    if recompute:  # Korthikanti et al. table 2: each layer's input, sharded with sequence parallelism
        per_layer = 2 * sbh
    elif sp:  # compute_activation_memory (selective recomputation and sequence parallelism)
        per_layer = sbh * (18 - 2 * (1 - mask) + 4 * F / h)
    else:  # compute_activation_memory_without_sp
        per_layer = sbh * (10 - 2 * (1 - mask) + 24 / t)
    act = per_layer * L + 8 * s * b * p + mask * sbh * p
    if v > 1:
        act *= 1 + (p - 1) / (p * v)
    elif p > 1:
        act *= min(1, microbatches / p)
    if sp:
        if p == 1:
            act += 4 * sbh * (1 + V / h)
        return act / t
    if p == 1:
        act += 2 * (s * b * V / t + sbh)
    return act if recompute else act * 1.05


def in_flight_factor(p, v, microbatches):
    if v > 1:
        return 1 + (p - 1) / (p * v)
    return min(1, microbatches / p) if p > 1 else 1


def stated_differences(m, t, p, d, v, b, microbatches, recompute, sp, zero1, params):
    """Loom's known differences from Megatron's formulas, each with its bytes on the first stage:
    (what, weights-and-optimizer delta, activation delta)."""
    s, h, L, F, a, g = m["s"], m["h"], m["L"], m["F"], m["a"], m["g"]
    V = padded_vocab(m["V"], t)
    sbh = s * b * h
    reasons = []
    with_masks = megatron_activations(m, t, p, v, b, microbatches, recompute, sp)
    without = megatron_activations(m, t, p, v, b, microbatches, recompute, sp, masks=False)
    reasons.append(("no dropout masks are stored (the backward regenerates them from the Philox counter); the "
                    "formula counts 1 byte per element", 0, without - with_masks))
    layers = L * in_flight_factor(p, v, microbatches)
    split = t  # a tensor-parallel tensor per rank (the formula's 24/t; with sequence parallelism all /t)
    if not recompute:
        per_layer = 0.0
        if m["swiglu"]:
            # The formula's MLP term is 4F/h (F = 4h for the no-SP one): SwiGLU keeps both fc1 halves
            # (gate and up, 2F each) and their product (2F): 6F/h.
            per_layer += (6 * F / h - (4 * F / h if sp else 16)) * sbh / split
        elif not sp and F != 4 * h:
            per_layer += (4 * F / h - 16) * sbh / split
        if g != a:
            # Grouped-query attention: K and V are g/a as wide as the formula's (2sbh each).
            per_layer -= 4 * sbh * (1 - g / a) / split
        if per_layer:
            reasons.append(("the formula assumes a GeLU MLP of 4h and full-width K and V; this model's SwiGLU "
                            "and grouped-query attention keep what they keep", 0,
                            per_layer * layers * (1.0 if sp else 1.05)))
    if p == 1:
        # The output layer: Loom keeps its bf16 logits for the loss's backward, and its gathered
        # input (2sbh) with sequence parallelism; the formula counts fp32 (4sbV + 4sbh)/t then.
        if sp:
            loom_out = 2 * s * b * V / t + 2 * sbh
            reasons.append(("the output layer keeps bf16 logits and its gathered input (the formula: fp32, "
                            "sharded)", 0, loom_out - 4 * sbh * (1 + V / h) / t))
    return reasons


def one_layer(m, t, b, sp):
    """Megatron's memory of one layer's activations while it recomputes it."""
    sbh = m["s"] * b * m["h"]
    return sbh * 34 / t if sp else sbh * (10 + 24 / t)


def largest_weight_gradient(m, t):
    """The largest weight's 16-bit gradient temporary on a rank (Loom's weight_grad writes it, then it
    is added to the fp32 main gradient; Megatron's gradient-accumulation fusion writes into it)."""
    h, F = m["h"], m["F"]
    return 2 * max(h * F * (2 if m["swiglu"] else 1), h * 3 * h) / t


def write_configs(work, m, t, p, d, v, b, batch, recompute, sp, zero1, devices):
    model = os.path.join(work, m["name"] + ".pbtxt")
    with open(model, "w") as f:
        f.write(f'name: "{m["name"]}"\narchitecture: {m["arch"]}\nnum_layers: {m["L"]}\nhidden_size: {m["h"]}\n'
                f'num_attention_heads: {m["a"]}\nseq_length: {m["s"]}\nvocab_size: {m["V"]}\nparams_dtype: BF16\n')
        if m["arch"] == "LLAMA":
            f.write(f'num_key_value_heads: {m["g"]}\nffn_hidden_size: {m["F"]}\n')
    cluster = os.path.join(work, m["name"] + "-cluster.pbtxt")
    world = t * p * d
    nodes = max(1, world // 8)
    schedule = "INTERLEAVED_ONE_F_ONE_B" if v > 1 else "ONE_F_ONE_B"
    with open(cluster, "w") as f:
        f.write(f'name: "{m["name"]}-{world}"\nnodes: {nodes}\ndevices_per_node: {world // nodes}\n'
                f'device_file: "{devices}/a100-sxm4-80gb.pbtxt"\n'
                f'parallel {{ tensor_parallel_size: {t} pipeline_parallel_size: {p} data_parallel_size: {d} '
                f'virtual_pipeline_size: {v} micro_batch_size: {b} global_batch_size: {batch} '
                f'recompute: {"RECOMPUTE_FULL" if recompute else "RECOMPUTE_NONE"} schedule: {schedule} '
                f'sequence_parallel: {"true" if sp else "false"} zero1: {"true" if zero1 else "false"} }}\n')
    return model, cluster


def check(r):
    """(passes, notes): Loom against Megatron's figures, adjusted by the stated differences."""
    ok, notes = True, []
    for what, loom, megatron, delta in (("weights and optimizer", r["lw"], r["mw"], sum(x[1] for x in r["reasons"])),
                                        ("activations", r["la"], r["ma"], sum(x[2] for x in r["reasons"]))):
        raw = loom / megatron - 1
        adjusted = loom / (megatron + delta) - 1
        if abs(adjusted) > TOLERANCE:
            ok = False
            notes.append(f"{what}: Loom {loom / GiB:.2f} GiB, Megatron {megatron / GiB:.2f} GiB ({raw:+.1%}), "
                         f"{adjusted:+.1%} after the stated differences")
        elif abs(raw) > TOLERANCE and not any((x[1] if what.startswith("weights") else x[2]) for x in r["reasons"]):
            ok = False
            notes.append(f"{what}: {raw:+.1%} without a stated reason")
    if r["rec"] == "full":
        # Recomputing a layer: one layer's activations and its backward's gradients, the largest a
        # weight's 16-bit gradient; with ZeRO-1 the optimizer's two fp32 shards may be larger.
        bound = max(1.5 * (r["layer"] + r["wgrad"]), 1.01 * r["zero1_temps"])
        if r["ws"] > bound:
            ok = False
            notes.append(f"workspace {r['ws'] / GiB:.2f} GiB over {bound / GiB:.2f} GiB (1.5 x (one layer "
                         f"{r['layer'] / GiB:.2f} + largest weight gradient {r['wgrad'] / GiB:.2f}) or ZeRO-1's "
                         f"shards {r['zero1_temps'] / GiB:.2f})")
    if r["peak"] > 80 * GiB:
        ok = False
        notes.append(f"peak {r['peak'] / GiB:.1f} GiB does not fit 80 GiB")
    return ok, notes


def ratio(loom, megatron, delta):
    return f"{loom / megatron:.2f}" + (f" (adj. {loom / (megatron + delta):.2f})" if delta else "")


def text(rows):
    lines = [f"{'configuration':16}{'layout':26}{'rec':5}{'sp':3}{'z1':3} {'W+O Megatron':>13} {'Loom':>7} "
             f"{'ratio':>16} {'act Megatron':>13} {'Loom':>7} {'ratio':>16} {'workspace':>10} {'peak':>7}  result"]
    for r in rows:
        dw, da = sum(x[1] for x in r["reasons"]), sum(x[2] for x in r["reasons"])
        lines.append(f"{r['name']:16}{r['layout']:26}{r['rec']:5}{int(r['sp']):<3}{int(r['zero1']):<3} "
                     f"{r['mw'] / GiB:13.1f} {r['lw'] / GiB:7.1f} {ratio(r['lw'], r['mw'], dw):>16} "
                     f"{r['ma'] / GiB:13.1f} {r['la'] / GiB:7.1f} {ratio(r['la'], r['ma'], da):>16} "
                     f"{r['ws'] / GiB:10.2f} {r['peak'] / GiB:7.1f}  {'ok' if r['ok'] else 'FAIL'}")
    lines.append("GiB; ratio: Loom / Megatron (adj.: against Megatron's figure with the stated differences);")
    lines.append("peak: Loom's whole plan with the CUDA backend's additions (80 GiB A100s). Stated differences:")
    seen = []
    for r in rows:
        for what, dw, da in r["reasons"]:
            if what not in seen:
                seen.append(what)
    lines += [f"  [{i + 1}] {w}" for i, w in enumerate(seen)]
    return "\n".join(lines)


def markdown(rows):
    out = ["| configuration | layout | recompute | SP | ZeRO-1 | weights+optimizer Megatron / Loom | "
           "activations Megatron / Loom | workspace | peak |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        dw, da = sum(x[1] for x in r["reasons"]), sum(x[2] for x in r["reasons"])
        out.append(f"| {r['name']} | {r['layout']} | {r['rec']} | {'yes' if r['sp'] else 'no'} | "
                   f"{'yes' if r['zero1'] else 'no'} | {r['mw'] / GiB:.1f} / {r['lw'] / GiB:.1f}: "
                   f"{ratio(r['lw'], r['mw'], dw)} | {r['ma'] / GiB:.1f} / {r['la'] / GiB:.1f}: "
                   f"{ratio(r['la'], r['ma'], da)} | {r['ws'] / GiB:.2f} | {r['peak'] / GiB:.1f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="directory with loomc and loom-dump")
    ap.add_argument("--devices", default=os.path.join(os.path.dirname(__file__), "..", "..", "examples", "devices"))
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--only", default=None, help="comma-separated configuration names")
    ap.add_argument("--markdown", action="store_true", help="the table as Markdown (the README's)")
    args = ap.parse_args()
    devices = os.path.abspath(args.devices)
    work = args.work or tempfile.mkdtemp(prefix="megatron-memory-")
    os.makedirs(work, exist_ok=True)
    rows, failures = [], []
    for (m, t, p, d, v, b, batch, recompute, sp, zero1) in CONFIGS:
        if args.only and m["name"] not in args.only.split(","):
            continue
        model, cluster = write_configs(work, m, t, p, d, v, b, batch, recompute, sp, zero1, devices)
        plans = os.path.join(work, m["name"] + "-plans")
        r = subprocess.run([os.path.join(args.bin, "loomc"), "compile", model, "--cluster", cluster, "--out", plans,
                            "--quiet"], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"{m['name']}: loomc compile failed: {r.stderr.strip()}")
            continue
        r = subprocess.run([os.path.join(args.bin, "loom-dump"), plans, "--view=memory", "--json", "--rank", "0"],
                           capture_output=True, text=True, check=True)
        rep = json.loads(r.stdout)
        subprocess.run(["rm", "-rf", plans])
        microbatches = batch // (b * d)
        params, mw = megatron_weights(m, t, p, d, zero1)
        ma = megatron_activations(m, t, p, v, b, microbatches, recompute, sp)
        wo = rep["weights_and_optimizer"]
        lw = wo["bytes"]
        act = rep["activations"]
        la = act["peak_stash_bytes"] + act["peak_input_bytes"]
        reasons = stated_differences(m, t, p, d, v, b, microbatches, recompute, sp, zero1, params)
        rows.append(dict(name=m["name"], layout=f"t{t} p{p} d{d} v{v} b{b} m{microbatches}", reasons=reasons,
                         rec="full" if recompute else "none", sp=sp, zero1=zero1,
                         mw=mw, lw=lw, ma=ma, la=la, ws=rep["workspace"]["bytes"], peak=rep["peak_bytes"],
                         params=params, lparams=wo["parameters"], inflight=act["micro_batches_in_flight"],
                         layer=one_layer(m, t, b, sp), wgrad=largest_weight_gradient(m, t),
                         zero1_temps=8 * wo["parameters"] / d if zero1 else 0))
    for r in rows:
        r["ok"], r["notes"] = check(r)
        if not r["ok"]:
            failures.append(f"{r['name']}: " + "; ".join(r["notes"]))
    print(markdown(rows) if args.markdown else text(rows))
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
