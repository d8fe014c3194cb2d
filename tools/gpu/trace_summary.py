"""Where a step's time goes, from a `loomrun --trace` Chrome trace (one rank): per step, the
span from the first forward's embedding to the last event, the compute stream's busy time, and
the time per op (forward, backward, optimizer), costliest first. The GPU check runs it on the
1.3B GPT so that every GPU session reports the same breakdown.

usage: python3 tools/gpu/trace_summary.py TRACE.json [--top 12]
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    events = sorted((e for e in json.load(open(args.trace))["traceEvents"] if e["ph"] == "X"), key=lambda e: e["ts"])
    starts = [i for i, e in enumerate(events)
              if e["name"] == "embedding" and e["args"]["program"].startswith("forward") and e["args"]["micro_batch"] == 0]
    for k, first in enumerate(starts):
        step = events[first:starts[k + 1] if k + 1 < len(starts) else len(events)]
        per_op = collections.defaultdict(float)
        count = collections.Counter()
        for e in step:
            program = e["args"]["program"]
            phase = "backward" if program.startswith("backward") else program.split("_")[0]
            per_op[(e["name"], phase)] += e["dur"]
            count[(e["name"], phase)] += 1
        span = (step[-1]["ts"] + step[-1]["dur"] - step[0]["ts"]) / 1e3
        busy = sum(e["dur"] for e in step if e["cat"] == "compute") / 1e3
        print(f"step {k + 1}: {span:.1f} ms, compute stream busy {busy:.1f} ms")
        for (name, phase), us in sorted(per_op.items(), key=lambda x: -x[1])[:args.top]:
            print(f"  {name:24s} {phase:10s} {count[(name, phase)]:5d} x  {us / 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
