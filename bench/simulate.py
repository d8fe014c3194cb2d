"""The simulator against Loom's own measured CPU step time, on local configurations.

`loomc calibrate` measures this machine (kernels on the CPU executor, Gloo over loopback) into a
device file; for each configuration below the same model is compiled, `loomc simulate --device`
predicts the step, and `loomrun` trains it on local CPU ranks (one BLAS thread each, synthetic
tokens) and logs the whole iteration's time. A benchmark, not a test.

This VM drifts: its speed changes by ~10% over minutes and its Gloo loopback latencies by up to
2x between calibrations a minute apart. So prediction and measurement sample the same period:
the run goes in rounds (--rounds, default 3), each a calibration followed by every
configuration's iterations; the prediction is the mean of the rounds' predictions (their range
printed), the measurement the median of all rounds' timed iterations (their range printed).
--device FILE predicts from one given device file instead (no calibration).

usage: simulate.py [--bin DIR] [--rounds 3] [--steps 6] [--warmup 2] [--device FILE] [--only NAME]
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
    return os.path.join(root, "apps", name)


def cluster(name, ranks, t, p, d, b, m, schedule):
    return (f'name: "{name}"\nnodes: 1\ndevices_per_node: {ranks}\n'
            'device { kind: CPU model: "x86-64 core" peak_flops: 1e11 memory_bytes: 8000000000 }\n'
            'intra_node { bandwidth_bytes_per_s: 1e9 latency_s: 1e-4 }\n'
            f'parallel {{ tensor_parallel_size: {t} pipeline_parallel_size: {p} data_parallel_size: {d} '
            f'micro_batch_size: {b} global_batch_size: {b * d * m} schedule: {schedule} }}\n')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="a directory with loomc and loomrun (default: this checkout's bazel-bin)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="iterations per configuration and round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", help="a device file from loomc calibrate (default: calibrate in every round)")
    ap.add_argument("--only", help="run only the configurations whose name contains this")
    args = ap.parse_args()
    configs = [c for c in CONFIGS if not args.only or args.only in c[0]]
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, "model.pbtxt")
        with open(model, "w") as f:
            f.write(MODEL)
        plans = []
        for k, (name, ranks, t, p, d, b, m, schedule) in enumerate(configs):
            spec, out = os.path.join(work, f"c{k}.pbtxt"), os.path.join(work, f"plans{k}")
            with open(spec, "w") as f:
                f.write(cluster(f"bench-{k}", ranks, t, p, d, b, m, schedule))
            subprocess.run([tool(args, "loomc"), "compile", model, "--cluster", spec, "--out", out, "--quiet"],
                           check=True)
            plans.append(out)
        predicted = [[] for _ in configs]
        measured = [[] for _ in configs]
        for r in range(args.rounds):
            device = args.device
            if not device:
                device = os.path.join(work, f"device{r}.pbtxt")
                subprocess.run([tool(args, "loomc"), "calibrate", "--out", device, "--threads", "1"], check=True,
                               stderr=subprocess.DEVNULL)
            for k, (name, ranks, *_rest) in enumerate(configs):
                sim = subprocess.run([tool(args, "loomc"), "simulate", plans[k], "--device", device, "--json"],
                                     check=True, capture_output=True, text=True).stdout
                predicted[k].append(json.loads(sim)["step_time_s"] * 1e3)
                out = subprocess.run([tool(args, "loomrun"), "--nproc", str(ranks), "--plans", plans[k], "--steps",
                                      str(args.steps), "--threads", "1"], check=True, capture_output=True,
                                     text=True).stdout
                times = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", out)]
                if len(times) <= args.warmup:
                    sys.exit(f"simulate.py: too few iteration times in the log of {name}:\n{out}")
                measured[k] += times[args.warmup:]
        print(f"model gpt-4x256 (4 layers, hidden 256, 8 heads, seq 256, vocabulary 4096), 1 BLAS thread per rank; "
              f"{args.rounds} rounds of {args.steps - args.warmup} timed iterations after {args.warmup} per "
              "configuration; " + (f"device file {args.device}" if args.device else "a calibration in every round"))
        print(f"{'configuration':22s} {'ranks':>5s} {'predicted':>10s} {'(rounds)':>17s} {'measured':>10s} "
              f"{'(iterations)':>17s} {'error':>7s}")
        errors = []
        for k, (name, ranks, *_rest) in enumerate(configs):
            pred, meas = statistics.mean(predicted[k]), statistics.median(measured[k])
            err = (pred - meas) / meas
            errors.append(abs(err))
            print(f"{name:22s} {ranks:5d} {pred:7.1f} ms ({min(predicted[k]):6.1f}..{max(predicted[k]):6.1f}) "
                  f"{meas:7.1f} ms ({min(measured[k]):6.1f}..{max(measured[k]):6.1f}) {100 * err:+6.1f}%")
        print(f"largest error {100 * max(errors):.1f}%, mean {100 * statistics.mean(errors):.1f}% over {len(errors)} "
              "configurations")


if __name__ == "__main__":
    main()
