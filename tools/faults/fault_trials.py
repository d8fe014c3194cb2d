#!/usr/bin/env python3
"""Fault-injection trials of a (t,p,d) = (2,2,1) training job on 4 local CPU ranks.

Each trial starts `loomrun` with checkpoints every few iterations, then at a random moment
(some trials: the moment a checkpoint save is under way) sends SIGKILL or SIGSTOP to a random
rank or to the coordinator. It checks that the job ends within 30 s, non-zero, naming what
failed; that no process of the job is left; that no published checkpoint was damaged; and
that `--resume` continues from the newest complete checkpoint with the losses of an
uninterrupted run, iteration for iteration. Prints one line per trial and a summary.

With --max-restarts N the job is launched with `loomrun --max-restarts N`: each trial must then
end by itself, exit 0, having restarted from the newest complete checkpoint, with every
iteration's loss equal to the uninterrupted run's. --async-save writes the checkpoints in the
background (a fault aimed at a save then lands while the writer threads work).

  /usr/bin/python3 tools/faults/fault_trials.py --bin DIR [--trials 50] [--seed 1] [--max-restarts 2] [--async-save]
DIR holds loomc, loomrun, loom-rank and loom-coord (the ordinary build's binaries)."""
import argparse, glob, os, random, re, shutil, signal, subprocess, sys, tempfile, time

STEPS, SAVE_INTERVAL = 30, 3


def loss_map(path):
    """iteration -> loss line from a --loss-log file (a resumed run appends; later wins)."""
    out = {}
    if os.path.exists(path):
        for line in open(path):
            parts = line.split()
            if len(parts) >= 2:
                out[int(parts[0])] = parts[1]
    return out


def processes():
    """(pid, command line) of every process, from ps."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    for line in out.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        yield int(pid), args


def job_processes(*tags):
    """PIDs of this trial's loomrun, loom-coord and loom-rank processes (matched by its plans
    directory, which loomrun and loom-coord carry, or its --save directory, which the ranks do)."""
    return [pid for pid, args in processes() if any(t in args for t in tags) and re.search(r"loom(run|-coord|-rank)", args)]


def rank_pid(tag, rank):
    return next((pid for pid, args in processes()
                 if "loom-rank" in args and tag in args and re.search(r"--rank %d(\s|$)" % rank, args)), None)


def coord_pid(tag):
    return next((pid for pid, args in processes() if "loom-coord" in args and tag in args), None)


def published(save):
    return sorted(int(m.group(1)) for d in glob.glob(save + "/iter_*") if (m := re.search(r"iter_(\d+)$", d))
                  and os.path.exists(d + "/manifest.json"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default="")
    ap.add_argument("--max-restarts", type=int, default=0)
    ap.add_argument("--async-save", action="store_true")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    work = a.work or tempfile.mkdtemp(prefix="loom-faults-")
    os.makedirs(work, exist_ok=True)
    plans = os.path.join(work, "plans_fault_trials")  # the tag that finds the job's processes
    subprocess.run([os.path.join(a.bin, "loomc"), "compile", os.path.join(root, "examples/models/gpt-tiny.pbtxt"),
                    "--cluster", os.path.join(root, "examples/clusters/cpu-4.pbtxt"), "--out", plans, "--quiet"],
                   check=True)
    loomrun = os.path.join(a.bin, "loomrun")
    common = ["--nproc", "4", "--plans", plans, "--steps", str(STEPS), "--decay-iters", str(STEPS), "--seed", "5",
              "--save-interval", str(SAVE_INTERVAL), "--comm-timeout", "20"] + (["--async-save"] if a.async_save else [])
    restarts = ["--max-restarts", str(a.max_restarts)] if a.max_restarts else []

    ref_save, ref_log = os.path.join(work, "reference"), os.path.join(work, "reference.log")
    shutil.rmtree(ref_save, ignore_errors=True)
    t0 = time.time()
    r = subprocess.run([loomrun, *common, "--save", ref_save, "--loss-log", ref_log], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("fault_trials: the uninterrupted reference run failed:\n" + r.stdout + r.stderr)
    reference, run_seconds = loss_map(ref_log), time.time() - t0
    print("reference: %d iterations in %.1f s, checkpoints every %d" % (len(reference), run_seconds, SAVE_INTERVAL),
          flush=True)

    rng = random.Random(a.seed)
    results = []
    for trial in range(a.trials):
        save, log = os.path.join(work, "trial_save"), os.path.join(work, "trial.log")
        shutil.rmtree(save, ignore_errors=True)
        if os.path.exists(log):
            os.remove(log)
        target = rng.choice(["rank 0", "rank 1", "rank 2", "rank 3", "coordinator"])
        sig = rng.choice([signal.SIGKILL, signal.SIGSTOP])
        during_save = rng.random() < 0.3
        # The moment: after a random iteration (the loss log grows by one line per iteration),
        # plus a random fraction of one; or, aimed at a save, the next save in progress after it.
        after_iteration = rng.randint(2, STEPS - 4)
        extra = rng.uniform(0, run_seconds / STEPS)
        out_path = os.path.join(work, "trial.out")
        with open(out_path, "w") as out:
            job = subprocess.Popen([loomrun, *common, *restarts, "--save", save, "--loss-log", log], stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
            started = time.time()
            def iterations_done():
                try:
                    return sum(1 for _ in open(log))
                except OSError:
                    return 0
            while job.poll() is None and iterations_done() < after_iteration and time.time() - started < 120:
                time.sleep(0.005)
            if during_save:
                while job.poll() is None and not glob.glob(save + "/iter_*.partial") and time.time() - started < 120:
                    time.sleep(0.0005)
            else:
                time.sleep(extra)
            pid = coord_pid(plans) if target == "coordinator" else rank_pid(save, int(target.split()[1]))
            saving = bool(glob.glob(save + "/iter_*.partial"))
            before = published(save)
            killed_at = time.time()
            if pid is None or job.poll() is not None:
                job.wait()
                results.append(dict(trial=trial, ok=False, why="the job ended before the fault"))
                print("trial %2d: skipped: the job ended before the fault" % trial, flush=True)
                continue
            os.kill(pid, sig)
            try:  # with restarts the job goes on to the end: a whole run's time more
                code = job.wait(timeout=60 + (3 * run_seconds + 60) * a.max_restarts)
            except subprocess.TimeoutExpired:
                code = None
            exit_seconds = time.time() - killed_at
        text = open(out_path, errors="replace").read()
        # Whatever is left of the job (a stopped process included) is a failure; clean it up.
        time.sleep(0.5)
        left = job_processes(plans, save)
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if code is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        errors = [l for l in text.splitlines() if "error" in l]
        named = target in text if target != "coordinator" else ("coordinator" in text)
        # The checkpoints published before the fault are all still there and complete.
        lost = [it for it in before if it not in published(save)]
        latest_before = max(before) if before else 0
        if a.max_restarts:
            # The job restarted by itself and finished: every iteration's loss (the resumed attempt
            # appends to the log) is the uninterrupted run's.
            m = re.search(r"resumed from checkpoint at iteration (\d+)", text)
            resumed_from = int(m.group(1)) if m else 0
            losses = loss_map(log)
            same = all(losses.get(i) == reference[i] for i in reference)
            restarted = "restarting the job" in text
            ok = code == 0 and restarted and same and not left and not lost and resumed_from >= latest_before
            results.append(dict(trial=trial, ok=ok, exit=exit_seconds, left=len(left), lost=len(lost), saving=saving))
            print("trial %2d: %-4s %-11s %-7s%s exit %4s after %5.1f s, %s, %d left, %d checkpoints lost, resumed from "
                  "%2d (latest complete %2d), losses %s" % (
                      trial, "ok" if ok else "FAIL", target, signal.Signals(sig).name,
                      " (during a save)" if saving else "", code, exit_seconds,
                      "restarted" if restarted else "NOT restarted", len(left), len(lost), resumed_from,
                      latest_before, "equal" if same else "DIFFER"), flush=True)
            continue
        resume = subprocess.run([loomrun, *common, "--save", save, "--resume", "--loss-log", log],
                                capture_output=True, text=True)
        m = re.search(r"resumed from checkpoint at iteration (\d+)", resume.stdout + resume.stderr)
        resumed_from = int(m.group(1)) if m else 0
        fallback = "unusable" in resume.stdout + resume.stderr
        losses = loss_map(log)
        same = resume.returncode == 0 and all(losses.get(i) == reference[i] for i in reference)
        ok = (code not in (None, 0) and exit_seconds <= 30 and named and not left and not lost and same and
              resumed_from >= latest_before and not fallback)
        results.append(dict(trial=trial, ok=ok, exit=exit_seconds, left=len(left), lost=len(lost), saving=saving))
        print("trial %2d: %-4s %-11s %-7s%s exit %4s after %5.1f s, %d left, %d checkpoints lost, resumed from %2d "
              "(latest complete %2d)%s, losses %s | %s" % (
                  trial, "ok" if ok else "FAIL", target, signal.Signals(sig).name, " (during a save)" if saving else "",
                  code, exit_seconds, len(left), len(lost), resumed_from, latest_before,
                  ", fell back" if fallback else "", "equal" if same else "DIFFER",
                  (errors[0] if errors else "no error line")[:160]), flush=True)
        if resume.returncode != 0:
            tail = (resume.stdout + resume.stderr).strip().splitlines()[-3:]
            print("    the resumed run exited %d:\n%s" % (resume.returncode, "\n".join("    " + l for l in tail)), flush=True)
    good = [r for r in results if r["ok"]]
    exits = [r["exit"] for r in results if "exit" in r]
    print("summary%s: %d of %d trials ok; %d during a save; exit within %.1f s (max), processes left %d, "
          "checkpoints lost %d" % ((" (--max-restarts %d%s)" % (a.max_restarts, ", --async-save" if a.async_save else ""))
                                   if a.max_restarts else "", len(good), len(results),
                                   sum(1 for r in results if r.get("saving")),
                                   max(exits) if exits else 0, sum(r.get("left", 0) for r in results),
                                   sum(r.get("lost", 0) for r in results)), flush=True)
    sys.exit(0 if len(good) == len(results) else 1)


if __name__ == "__main__":
    main()
