#!/usr/bin/env python3
"""Checkpoints that move between layouts (issue 39): a run in layout A saves at iteration 10 and
goes on to 20; runs in other layouts resume from A's iteration-10 checkpoint and train 11..20;
each one's losses must equal A's own 11..20 (the uninterrupted run's) within fp32 tolerance.

Layouts (t, p, d, v, ZeRO-1) as the issue names them: saved at (2,2,1) with ZeRO-1, resumed at
(1,2,2) (with and without ZeRO-1: the optimizer state resharded into dp parts), (4,1,1),
(1,1,1), interleaved (1,2,1, v = 2) and context parallel (d = 2, c = 2, ZeRO-1 over the d x c
ranks); for a mixture of experts also across expert parallelism.
The global batch stays (the data position and the schedule count its iterations).
With --precision bf16 the saving layout is (1,2,2) with ZeRO-1, whose fp32 master weights are
sharded (each rank saves its parts): its own layout must resume bit for bit, the others within
BF16_TOLERANCE (their reductions round in other places). With --moe --precision bf16 the MoE
layouts resume in bf16 (the expert-parallel saving run's masters sharded over d = 4).
"""
import argparse
import os
import shutil
import subprocess
import sys

MICRO_BATCH, GLOBAL_BATCH, STEPS, SAVE_AT = 2, 8, 20, 10
PRECISION = "fp32"
# name -> (t, p, d, v, schedule, zero1, ep[, context parallel c])
LAYOUTS = {
    "t2p2d1-zero1": (2, 2, 1, 1, "ONE_F_ONE_B", True, 1),
    "t1p2d2": (1, 2, 2, 1, "ONE_F_ONE_B", False, 1),
    "t1p2d2-zero1": (1, 2, 2, 1, "ONE_F_ONE_B", True, 1),
    "t4p1d1": (4, 1, 1, 1, "", False, 1),
    "t1p1d1": (1, 1, 1, 1, "", False, 1),
    "t1p2d1v2-interleaved": (1, 2, 1, 2, "INTERLEAVED_ONE_F_ONE_B", False, 1),
    "t1p1d4-zero1": (1, 1, 4, 1, "", True, 1),
    "t1p1d4e2-zero1": (1, 1, 4, 1, "", True, 2),
    "t2p1d2e2": (2, 1, 2, 1, "", False, 2),
    "t1p1d2c2-zero1": (1, 1, 2, 1, "", True, 1, 2),
}
DENSE = ("t2p2d1-zero1", ["t1p2d2", "t1p2d2-zero1", "t4p1d1", "t1p1d1", "t1p2d1v2-interleaved", "t1p1d2c2-zero1"])
MOE = ("t1p1d4e2-zero1", ["t1p1d1", "t2p1d2e2", "t1p2d2-zero1"])
# bf16: saved where the master weights are sharded; resumed in the same layout, and in layouts
# with whole masters (d = 1), other parts (d = 4) and context parallelism.
BF16 = ("t1p2d2-zero1", ["t1p2d2-zero1", "t2p2d1-zero1", "t1p1d1", "t1p1d4-zero1", "t1p1d2c2-zero1"])
TOLERANCE = 2e-5  # |loss difference| after up to 10 steps in two fp32 layouts
BF16_TOLERANCE = 1e-3  # in two bf16 layouts (the layout invariance bound of runtime_test's bf16 plans)


def model_without_dropout(path, work):
    """The model with dropout 0: its masks differ between layouts by design (tensor-parallel ranks
    draw distinct streams inside their regions, Megatron's model-parallel RNG), so only a model
    without dropout continues in another layout exactly as the saving layout did."""
    out = os.path.join(work, "model.pbtxt")
    with open(path) as f, open(out, "w") as g:
        for line in f:
            if not line.startswith(("hidden_dropout", "attention_dropout")):
                g.write(line)
        g.write("hidden_dropout: 0\nattention_dropout: 0\n")
    return out


def cluster(work, name):
    t, p, d, v, schedule, zero1, ep = LAYOUTS[name][:7]
    cp = LAYOUTS[name][7] if len(LAYOUTS[name]) > 7 else 1
    path = os.path.join(work, name + ".pbtxt")
    extra = ((f" schedule: {schedule}" if schedule else "") + (f" expert_parallel_size: {ep}" if ep > 1 else "") +
             (f" context_parallel_size: {cp}" if cp > 1 else ""))
    with open(path, "w") as f:
        f.write(f'name: "{name}"\nnodes: 1\ndevices_per_node: {t * p * d * cp}\ndevice {{ kind: CPU }}\n'
                f"parallel {{ tensor_parallel_size: {t} pipeline_parallel_size: {p} data_parallel_size: {d} "
                f"virtual_pipeline_size: {v} micro_batch_size: {MICRO_BATCH} global_batch_size: {GLOBAL_BATCH} "
                f"zero1: {'true' if zero1 else 'false'} dp_bucket_size_bytes: 40000{extra}"
                f"{' precision: PRECISION_BF16' if PRECISION == 'bf16' else ''} }}\n")
    return path


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout}")
    return r.stdout


def ranks(name):
    t, p, d = LAYOUTS[name][:3]
    return t * p * d * (LAYOUTS[name][7] if len(LAYOUTS[name]) > 7 else 1)


def train(args, work, name, save, resume, async_save=False):
    plans = os.path.join(work, name + "-plans")
    if not os.path.isdir(plans):
        run([os.path.join(args.bin, "loomc"), "compile", args.model, "--cluster", cluster(work, name), "--out", plans,
             "--quiet"])
    log = os.path.join(work, f"{name}{'-resumed' if resume else ''}.loss")
    if os.path.exists(log):
        os.remove(log)
    out = run([os.path.join(args.bin, "loomrun"), "--nproc", str(ranks(name)), "--plans", plans, "--seed", "5",
               "--steps", str(STEPS), "--lr", "3e-3", "--min-lr", "3e-4", "--warmup", "3", "--decay-iters", str(STEPS),
               "--clip-grad", "1.0", "--weight-decay", "0.1", "--adam-eps", "1e-6", "--save", save,
               "--save-interval", str(SAVE_AT), "--loss-log", log] + (["--resume"] if resume else []) +
              (["--async-save"] if async_save else []))
    losses = {}
    with open(log) as f:
        for line in f:
            it, loss = line.split()[:2]
            losses[int(it)] = float(loss)
    return losses, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--moe", action="store_true", help="the mixture-of-experts layouts (expert parallelism)")
    ap.add_argument("--async-save", action="store_true", help="the saving run writes its checkpoints in the background")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = ap.parse_args()
    global PRECISION
    PRECISION = args.precision
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    args.model = model_without_dropout(args.model, args.work)
    source, targets = MOE if args.moe else BF16 if args.precision == "bf16" else DENSE
    saved = os.path.join(args.work, source + "-checkpoints")
    uninterrupted, out = train(args, args.work, source, saved, resume=False, async_save=args.async_save)
    if args.async_save and "written in the background" not in out:
        raise SystemExit(f"--async-save: the saving run wrote no checkpoint in the background:\n{out}")
    failures = 0
    for name in targets:
        # The new layout's own checkpoint directory starts as a copy of A's iteration 10.
        save = os.path.join(args.work, name + "-resumed-checkpoints")
        shutil.rmtree(save, ignore_errors=True)
        os.makedirs(save)
        shutil.copytree(os.path.join(saved, f"iter_{SAVE_AT:07d}"), os.path.join(save, f"iter_{SAVE_AT:07d}"))
        with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(f"{SAVE_AT}\n")
        resumed, out = train(args, args.work, name, save, resume=True)
        if f"resumed from checkpoint at iteration {SAVE_AT}" not in out:
            print(f"FAIL {source} -> {name}: did not resume from iteration {SAVE_AT}:\n{out}")
            failures += 1
            continue
        worst = max(abs(resumed[i] - uninterrupted[i]) for i in range(SAVE_AT + 1, STEPS + 1))
        bound = 0 if name == source else BF16_TOLERANCE if args.precision == "bf16" else TOLERANCE
        ok = sorted(resumed) == list(range(SAVE_AT + 1, STEPS + 1)) and worst <= bound
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {source} -> {name:22} losses {SAVE_AT + 1}..{STEPS}: worst difference "
              f"{worst:.1e} (loss {resumed[STEPS]:.6f}, uninterrupted {uninterrupted[STEPS]:.6f})", flush=True)
    print(f"{len(targets) - failures} of {len(targets)} resumed layouts continue as the uninterrupted run")
    if not args.moe:
        failures += hugging_face_round_trip(args, saved, targets[0])
    sys.exit(1 if failures else 0)


def hugging_face_round_trip(args, saved, layout):
    """loom-ckpt convert: A's iteration 10 to Hugging Face with AdamW's moments and back is lossless
    (converted out again, the files are byte for byte the same); a checkpoint converted from the
    Hugging Face weights alone resumes in another layout exactly as --init-from those weights
    starts (iteration 1, zero moments)."""
    ckpt = os.path.join(args.bin, "loom-ckpt")
    work = os.path.join(args.work, "hf")
    shutil.rmtree(work, ignore_errors=True)
    first, second = os.path.join(work, "a", "model.safetensors"), os.path.join(work, "b", "model.safetensors")
    run([ckpt, "convert", saved, "--iteration", str(SAVE_AT), "--to-hf", first, "--keep-optimizer"])
    run([ckpt, "convert", first, "--from-hf", "--model", args.model, "--optimizer",
         os.path.join(work, "a", "optimizer.safetensors"), "--out", os.path.join(work, "back")])
    run([ckpt, "convert", os.path.join(work, "back"), "--to-hf", second, "--keep-optimizer"])
    failures = 0
    for name in ("model.safetensors", "optimizer.safetensors", "config.json"):
        with open(os.path.join(work, "a", name), "rb") as f, open(os.path.join(work, "b", name), "rb") as g:
            same = f.read() == g.read()
        failures += not same
        print(f"{'ok  ' if same else 'FAIL'} Hugging Face round trip: {name} {'identical' if same else 'differs'}")
    weights = os.path.join(work, "weights-only")
    run([ckpt, "convert", first, "--from-hf", "--model", args.model, "--out", weights])
    plans = os.path.join(args.work, layout + "-plans")
    common = [os.path.join(args.bin, "loomrun"), "--nproc", str(ranks(layout)), "--plans", plans, "--seed", "5",
              "--steps", "5", "--lr", "3e-3", "--warmup", "2"]
    losses = []
    for extra, log in ((["--save", weights, "--resume"], "resumed"), (["--init-from", first], "init-from")):
        log = os.path.join(work, log + ".loss")
        run(common + extra + ["--loss-log", log])
        with open(log) as f:
            losses.append([line.split()[:2] for line in f])
    same = losses[0] == losses[1] and len(losses[0]) == 5
    failures += not same
    print(f"{'ok  ' if same else 'FAIL'} a checkpoint converted from Hugging Face resumes in {layout} as --init-from "
          f"starts: {losses[0][-1][1] if losses[0] else '?'} vs {losses[1][-1][1] if losses[1] else '?'}")
    return failures


if __name__ == "__main__":
    main()
