"""Data-parallel gradient reduction overlapped with the backward, measured on local CPU ranks.

The same model and layout (d = 2 by default) compiled twice: with the plan's bucket
all-reduces each waiting only on its own gradients (they start on the dp stream while the
backward goes on), and with serial_grad_reduce (every bucket waits for the whole backward).
Both train on synthetic tokens in the same run, alternating, and each prints the median and
spread of the whole iteration's time (the training log's elapsed time per iteration, warm-up
steps dropped). A benchmark, not a test: on a 2-core machine the dp thread competes with the
compute thread for the cores, so the gain is bounded by what the cores can overlap.

usage: overlap.py [--bin DIR] [--model MODEL.pbtxt] [--d 2] [--steps 12] [--bucket-bytes 2000000]
(default model: a GPT of 8 layers, hidden 256, vocabulary 1024, whose backward is mostly its
layers, so that the buckets have backward work to overlap)
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile


def cluster(d, micro_batch, global_batch, bucket, serial):
    return (f'name: "overlap-d{d}"\nnodes: 1\ndevices_per_node: {d}\n'
            'device { kind: CPU model: "x86-64 core" peak_flops: 1e11 memory_bytes: 8000000000 }\n'
            f'parallel {{ data_parallel_size: {d} micro_batch_size: {micro_batch} global_batch_size: {global_batch} '
            f'dp_bucket_size_bytes: {bucket} serial_grad_reduce: {"true" if serial else "false"} }}\n')


DEFAULT_MODEL = ('name: "gpt-8x256"\narchitecture: GPT\nnum_layers: 8\nhidden_size: 256\n'
                 'num_attention_heads: 8\nseq_length: 128\nvocab_size: 1024\n')


def tool(args, name):
    if args.bin:
        return os.path.join(args.bin, name)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bazel-bin")
    return os.path.join(root, "apps", name)


def iteration_ms(args, work, serial):
    name = "serial" if serial else "overlapped"
    spec = os.path.join(work, name + ".pbtxt")
    with open(spec, "w") as f:
        f.write(cluster(args.d, args.micro_batch, args.micro_batch * args.d * args.m, args.bucket_bytes, serial))
    plans = os.path.join(work, name)
    subprocess.run([tool(args, "loomc"), "compile", args.model, "--cluster", spec, "--out", plans,
                    "--quiet"], check=True)
    out = subprocess.run([tool(args, "loomrun"), "--nproc", str(args.d), "--plans", plans, "--steps",
                          str(args.steps), "--threads", "1"], check=True, capture_output=True, text=True).stdout
    times = [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", out)]
    if len(times) != args.steps:
        sys.exit(f"overlap.py: expected {args.steps} log lines, got {len(times)}:\n{out}")
    return times[args.warmup:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="a directory with loomc and loomrun (default: this checkout's bazel-bin)")
    ap.add_argument("--model", help="a model config or IR (default: see above)")
    ap.add_argument("--d", type=int, default=2)
    ap.add_argument("--m", type=int, default=2, help="micro-batches per step")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs of each variant")
    ap.add_argument("--bucket-bytes", type=int, default=2_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        if not args.model:
            args.model = os.path.join(work, "gpt-8x256.pbtxt")
            with open(args.model, "w") as f:
                f.write(DEFAULT_MODEL)
        got = {False: [], True: []}
        for _ in range(args.rounds):
            for serial in (False, True):
                got[serial] += iteration_ms(args, work, serial)
    print(f"model {os.path.basename(args.model)}, d={args.d}, micro-batch {args.micro_batch}, m={args.m}, "
          f"buckets of {args.bucket_bytes} bytes, 1 BLAS thread per rank, {args.rounds} x {args.steps - args.warmup} "
          "timed iterations per variant")
    for serial in (False, True):
        t = got[serial]
        print(f"  {'serial (after the backward)' if serial else 'overlapped (plan events)':30s} median "
              f"{statistics.median(t):8.1f} ms per iteration  (min {min(t):.1f}, max {max(t):.1f})")
    ratio = statistics.median(got[True]) / statistics.median(got[False])
    print(f"  serial / overlapped = {ratio:.3f}")


if __name__ == "__main__":
    main()
