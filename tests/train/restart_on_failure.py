#!/usr/bin/env python3
"""Jobs that restart themselves (issue 39): a (t,p,d) = (2,2,1) GPT job on 4 local ranks with
checkpoints every 3 iterations has a rank killed mid-run.
- `loomrun --max-restarts 1 --async-save`: the job relaunches on 4 ranks from the newest
  complete checkpoint and ends with exit 0, every iteration's loss the uninterrupted run's.
- `loomrun --max-restarts 1 --elastic --model M`: the killed rank's slot is gone; the job
  continues on the ranks that remain, in the layout loomc search picks for them with the same
  global batch (gpt-tiny fits no 3-rank layout: 2), and its losses are the uninterrupted run's
  within fp32 tolerance.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

STEPS, SAVE_INTERVAL, TOLERANCE = 30, 3, 2e-5
CLUSTER = ('name: "c4"\nnodes: 1\ndevices_per_node: 4\n'
           "device { kind: CPU peak_flops: 1e11 memory_bytes: 4000000000 memory_bandwidth_bytes_per_s: 1e10 }\n"
           "intra_node { bandwidth_bytes_per_s: 5e9 latency_s: 2e-5 }\n"
           "parallel { tensor_parallel_size: 2 pipeline_parallel_size: 2 micro_batch_size: 2 global_batch_size: 8 }\n")


def losses(path):
    out = {}
    for line in open(path):
        it, loss = line.split()[:2]
        out[int(it)] = float(loss)  # a resumed attempt appends: the later line wins
    return out


def rank_pid(tag, rank):
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    for line in ps.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        if "loom-rank" in args and tag in args and re.search(r"--rank %d(\s|$)" % rank, args):
            return int(pid)
    return None


def faulted_run(loomrun, common, save, log, extra, victim):
    """Starts the job, kills rank `victim` after iteration 8, waits for the job's end."""
    job = subprocess.Popen([loomrun, *common, "--save", save, "--loss-log", log, *extra], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    started = time.time()
    while job.poll() is None and time.time() - started < 120:
        if os.path.exists(log) and sum(1 for _ in open(log)) >= 8:
            break
        time.sleep(0.01)
    pid = rank_pid(save, victim)
    if pid is None:
        job.kill()
        raise SystemExit(f"rank {victim} was not running when the fault was due:\n{job.communicate()[0]}")
    os.kill(pid, signal.SIGKILL)
    out, _ = job.communicate(timeout=300)
    return job.returncode, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    # Without dropout: its tensor-parallel masks differ between layouts by design.
    model = os.path.join(args.work, "model.pbtxt")
    with open(args.model) as f, open(model, "w") as g:
        g.writelines(l for l in f if not l.startswith(("hidden_dropout", "attention_dropout")))
        g.write("hidden_dropout: 0\nattention_dropout: 0\n")
    cluster, plans = os.path.join(args.work, "c4.pbtxt"), os.path.join(args.work, "plans")
    with open(cluster, "w") as f:
        f.write(CLUSTER)
    subprocess.run([os.path.join(args.bin, "loomc"), "compile", model, "--cluster", cluster, "--out", plans, "--quiet"],
                   check=True)
    loomrun = os.path.join(args.bin, "loomrun")
    common = ["--nproc", "4", "--plans", plans, "--steps", str(STEPS), "--seed", "5",
              "--save-interval", str(SAVE_INTERVAL)]
    ref_log = os.path.join(args.work, "reference.log")
    subprocess.run([loomrun, *common, "--save", os.path.join(args.work, "reference"), "--loss-log", ref_log],
                   check=True, capture_output=True)
    reference = losses(ref_log)
    failures = 0
    for name, extra, victim, expect in (
            ("restart", ["--max-restarts", "1", "--async-save"], 1, "on 4 ranks"),
            ("elastic", ["--max-restarts", "1", "--elastic", "--model", model], 3, "continuing on 2 ranks")):
        save, log = os.path.join(args.work, name), os.path.join(args.work, name + ".log")
        code, out = faulted_run(loomrun, common, save, log, extra, victim)
        got = losses(log) if os.path.exists(log) else {}
        worst = max((abs(got.get(i, float("inf")) - reference[i]) for i in reference), default=float("inf"))
        m = re.search(r"resumed from checkpoint at iteration (\d+)", out)
        ok = code == 0 and expect in out and m is not None and worst <= TOLERANCE
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: rank {victim} killed, exit {code}, "
              f"{'resumed from iteration ' + m.group(1) if m else 'never resumed'}, "
              f"losses 1..{STEPS} worst difference {worst:.1e}")
        if not ok:
            print(out)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
