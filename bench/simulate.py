"""The simulator against Loom's own measured CPU step time, on local configurations.

`loomc calibrate` measures this machine once (kernels on the CPU executor, Gloo over
loopback) into a device file; then for each configuration below the same model is compiled,
`loomc simulate --device` predicts the step, and `loomrun` trains it on local CPU ranks (one
BLAS thread each, synthetic tokens) and logs the whole iteration's time. Printed per
configuration: predicted, measured (median of the logged iterations after the warm-up, with
the spread) and the error. A benchmark, not a test.

usage: simulate.py [--bin DIR] [--steps 8] [--warmup 2] [--device FILE] [--only NAME]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

MODEL = ('name: "gpt-4x256"\narchitecture: GPT\nnum_layers: 4\nhidden_size: 256\nnum_attention_heads: 8\n'
         'seq_length: 256\nvocab_size: 4096\n')

# (name, ranks, t, p, d, micro-batch, micro-batches, schedule)
CONFIGS = [
    ("1 rank, m=4", 1, 1, 1, 1, 2, 4, "SCHEDULE_DEFAULT"),
    ("t=2", 2, 2, 1, 1, 2, 2, "SCHEDULE_DEFAULT"),
    ("d=2", 2, 1, 1, 2, 2, 2, "SCHEDULE_DEFAULT"),
    ("p=2 1F1B m=4", 2, 1, 2, 1, 2, 4, "ONE_F_ONE_B"),
    ("p=2 GPipe m=4", 2, 1, 2, 1, 2, 4, "GPIPE"),
    ("t=2 p=2 1F1B m=4", 4, 2, 2, 1, 2, 4, "ONE_F_ONE_B"),
    ("t=2 d=2", 4, 2, 1, 2, 2, 2, "SCHEDULE_DEFAULT"),
    ("p=2 d=2 GPipe m=4", 4, 1, 2, 2, 2, 4, "GPIPE"),
]


def tool(args, name):
    if args.bin:
        return os.path.join(args.bin, name)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bazel-bin")
    return os.path.join(root, "compiler" if name == "loomc" else "runtime", name)


def cluster(name, ranks, t, p, d, b, m, schedule):
    return (f'name: "{name}"\nnodes: 1\ndevices_per_node: {ranks}\n'
            'device { kind: CPU model: "x86-64 core" peak_flops: 1e11 memory_bytes: 8000000000 }\n'
            'intra_node { bandwidth_bytes_per_s: 1e9 latency_s: 1e-4 }\n'
            f'parallel {{ tensor_parallel_size: {t} pipeline_parallel_size: {p} data_parallel_size: {d} '
            f'micro_batch_size: {b} global_batch_size: {b * d * m} schedule: {schedule} }}\n')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="a directory with loomc and loomrun (default: this checkout's bazel-bin)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", help="a device file from loomc calibrate (default: calibrate now)")
    ap.add_argument("--only", help="run only the configurations whose name contains this")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, "model.pbtxt")
        with open(model, "w") as f:
            f.write(MODEL)
        device = args.device
        if not device:
            device = os.path.join(work, "device.pbtxt")
            subprocess.run([tool(args, "loomc"), "calibrate", "--out", device, "--threads", "1"], check=True,
                           stderr=subprocess.DEVNULL)
        print(f"model gpt-4x256 (4 layers, hidden 256, 8 heads, seq 256, vocabulary 4096), 1 BLAS thread per "
              f"rank, {args.steps - args.warmup} timed iterations after {args.warmup}; device file {device if args.device else '(calibrated now)'}")
        print(f"{'configuration':22s} {'ranks':>5s} {'predicted':>11s} {'measured':>11s} {'spread':>17s} {'error':>7s}")
        errors = []
        for name, ranks, t, p, d, b, m, schedule in CONFIGS:
            if args.only and args.only not in name:
                continue
            spec = os.path.join(work, f"c{len(errors)}.pbtxt")
            plans = os.path.join(work, f"plans{len(errors)}")
            with open(spec, "w") as f:
                f.write(cluster(f"bench-{len(errors)}", ranks, t, p, d, b, m, schedule))
            subprocess.run([tool(args, "loomc"), "compile", model, "--cluster", spec, "--out", plans, "--quiet"],
                           check=True)
            sim = subprocess.run([tool(args, "loomc"), "simulate", plans, "--device", device, "--json"], check=True,
                                 capture_output=True, text=True).stdout
            predicted = json.loads(sim)["step_time_s"] * 1e3
            out = subprocess.run([tool(args, "loomrun"), "--nproc", str(ranks), "--plans", plans, "--steps",
                                  str(args.steps), "--threads", "1"], check=True, capture_output=True,
                                 text=True).stdout
            times = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", out)][args.warmup:]
            if not times:
                sys.exit(f"simulate.py: no iteration times in the log of {name}:\n{out}")
            measured = statistics.median(times)
            err = (predicted - measured) / measured
            errors.append(abs(err))
            print(f"{name:22s} {ranks:5d} {predicted:8.1f} ms {measured:8.1f} ms  ({min(times):6.1f}..{max(times):6.1f})"
                  f" {100 * err:+6.1f}%")
        print(f"largest error {100 * max(errors):.1f}%, mean {100 * statistics.mean(errors):.1f}% over {len(errors)} "
              "configurations")


if __name__ == "__main__":
    main()
