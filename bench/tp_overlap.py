"""Tensor-parallel communication overlap (parallel.tp_comm_overlap), measured on local CPU ranks.

The same model at t = 2 compiled twice: as is (each row-parallel GEMM, and each column-parallel
input gradient, then its tp all-reduce) and with tp_comm_overlap (those GEMMs in 4 blocks of
rows, each block's all-reduce on the tp stream while the next block's GEMM runs). Both train on
synthetic tokens in the same run, alternating, and from each run's trace (`loomrun --trace`)
the script takes, per step and rank over the timed steps: the tp stream's time, the part of it
not hidden behind the compute stream (exposed), and the whole iteration's time (the training
log's elapsed time per iteration). A benchmark, not a test: on a 2-core machine the tp thread
(Gloo) and the compute thread share the cores with one BLAS thread per rank.
--sequence-parallel: both with sequence parallelism, where the overlap splits each all-gather
before a GEMM and each reduce-scatter after one by samples (a chunk per sample, up to 4).

usage: tp_overlap.py [--bin DIR] [--model MODEL.pbtxt] [--steps 8] [--warmup 2] [--rounds 2]
                     [--sequence-parallel]
(default model: a GPT of 4 layers, hidden 512, seq 256, vocabulary 4096, micro-batch 4)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from intervals import minus_length, union

DEFAULT_MODEL = ('name: "gpt-4x512"\narchitecture: GPT\nnum_layers: 4\nhidden_size: 512\n'
                 'num_attention_heads: 8\nseq_length: 256\nvocab_size: 4096\n')


def cluster(micro_batch, global_batch, overlap, sp):
    return ('name: "tp2"\nnodes: 1\ndevices_per_node: 2\n'
            'device { kind: CPU model: "x86-64 core" peak_flops: 1e11 memory_bytes: 8000000000 }\n'
            f'parallel {{ tensor_parallel_size: 2 micro_batch_size: {micro_batch} global_batch_size: {global_batch} '
            f'tp_comm_overlap: {"true" if overlap else "false"} sequence_parallel: {"true" if sp else "false"} }}\n')


def tool(args, name):
    if args.bin:
        return os.path.join(args.bin, name)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bazel-bin", "apps", name)


def tp_seconds(trace_files, warmup):
    """(tp stream busy, tp exposed) in ms per step and rank over the steps after `warmup`."""
    busy = exposed = 0.0
    steps = 0
    for path in trace_files:
        events = sorted((e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"), key=lambda e: e["ts"])
        ends = [e["ts"] + e["dur"] for e, nxt in zip(events, events[1:] + [None])
                if e["args"]["program"] == "optimizer" and (nxt is None or nxt["args"]["program"] != "optimizer")]
        lo, hi = ends[warmup - 1], ends[-1]
        window = [e for e in events if lo <= e["ts"] < hi]
        compute = union([[e["ts"], e["ts"] + e["dur"]] for e in window if e["cat"] == "compute"])
        tp = [[e["ts"], e["ts"] + e["dur"]] for e in window if e["cat"] == "tp"]
        busy += sum(b - a for a, b in union(tp))
        exposed += minus_length(tp, compute)
        steps = len(ends) - warmup
    runs = steps * len(trace_files)
    return busy / 1e3 / runs, exposed / 1e3 / runs


def run(args, work, overlap):
    name = "overlap" if overlap else "plain"
    spec = os.path.join(work, name + ".pbtxt")
    with open(spec, "w") as f:
        f.write(cluster(args.micro_batch, args.micro_batch * args.m, overlap, args.sequence_parallel))
    plans = os.path.join(work, name)
    subprocess.run([tool(args, "loomc"), "compile", args.model, "--cluster", spec, "--out", plans, "--quiet"],
                   check=True)
    trace = os.path.join(work, name + "-trace")
    out = subprocess.run([tool(args, "loomrun"), "--nproc", "2", "--plans", plans, "--steps", str(args.steps),
                          "--threads", "1", "--trace", trace], check=True, capture_output=True, text=True).stdout
    times = [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", out)]
    if len(times) != args.steps:
        sys.exit(f"tp_overlap.py: expected {args.steps} log lines, got {len(times)}:\n{out}")
    busy, exposed = tp_seconds([os.path.join(trace, f"rank_{r}.json") for r in range(2)], args.warmup)
    return times[args.warmup:], busy, exposed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="a directory with loomc and loomrun (default: this checkout's bazel-bin)")
    ap.add_argument("--model", help="a model config or IR (default: see above)")
    ap.add_argument("--m", type=int, default=1, help="micro-batches per step")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs of each variant")
    ap.add_argument("--sequence-parallel", action="store_true",
                    help="both variants with sequence parallelism (all-gathers and reduce-scatters)")
    args = ap.parse_args()
    got = {False: ([], [], []), True: ([], [], [])}
    with tempfile.TemporaryDirectory() as work:
        if not args.model:
            args.model = os.path.join(work, "gpt-4x512.pbtxt")
            with open(args.model, "w") as f:
                f.write(DEFAULT_MODEL)
        for _ in range(args.rounds):
            for overlap in (False, True):
                times, busy, exposed = run(args, work, overlap)
                got[overlap][0].extend(times)
                got[overlap][1].append(busy)
                got[overlap][2].append(exposed)
    print(f"model {os.path.basename(args.model)}, t=2{' with sequence parallelism' if args.sequence_parallel else ''} "
          f"on 2 local ranks, micro-batch {args.micro_batch}, m={args.m}, "
          f"1 BLAS thread per rank, {args.rounds} x {args.steps - args.warmup} timed iterations per variant")
    for overlap in (False, True):
        times, busy, exposed = got[overlap]
        label = (("tp_comm_overlap (by samples)" if overlap else "all-gather / GEMM / reduce-scatter")
                 if args.sequence_parallel else ("tp_comm_overlap (4 row blocks)" if overlap else "GEMM, then its all-reduce"))
        print(f"  {label:34s} iteration median "
              f"{statistics.median(times):7.1f} ms (min {min(times):.1f}, max {max(times):.1f}); tp stream "
              f"{statistics.median(busy):6.1f} ms per step, exposed {statistics.median(exposed):6.1f} ms "
              f"(per round: {', '.join(f'{e:.1f}' for e in exposed)})")
    plain, over = statistics.median(got[False][2]), statistics.median(got[True][2])
    print(f"  exposed tp communication: {plain:.1f} -> {over:.1f} ms per step "
          f"({over / plain:.2f}); iteration: plain / overlapped = "
          f"{statistics.median(got[False][0]) / statistics.median(got[True][0]):.3f}")


if __name__ == "__main__":
    main()
