#!/usr/bin/env bash
# Every binary answers --help (and -h): exit 0, its flags listed on stdout, nothing on stderr. An
# unknown flag (those starting with h included) and a malformed number are each refused in one
# line on stderr naming the flag, exit 2.
set -uo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
tmp="${TEST_TMPDIR:-/tmp}/help_test.$$"
mkdir -p "$tmp"
fail=0

# BINARY and a command line on which its parsing fails only on the malformed number NUMBER.
# loom-gpt-bench exists only in a build with the CUDA toolkit.
cases=(
  "apps/loomc|calibrate --threads two"
  "apps/loom-dump|plans --rank one"
  "apps/loom-ckpt|inspect dir --iteration ten"
  "apps/loom-generate|--tokens many"
  "apps/loom-preprocess|--valid-fraction half"
  "apps/loomrun|--nproc four"
  "apps/loom-rank|--coordinator 127.0.0.1:9 --rank 0 --steps 1e"
  "apps/loom-coord|--plans p --heartbeat-timeout 10s"
  "bench/sgemm_peak|--size=big"
  "tools/gpu/loom-gpt-bench|--plans p --gemm-size 8k"
)

# expect_one_line_error NAME FLAG ARGS...: runs the binary with ARGS; it must exit 2 with one
# line on stderr that names FLAG, and print nothing on stdout.
expect_one_line_error() {
  local name=$1 flag=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local code=$? lines
  lines=$(wc -l <"$tmp/err")
  if [[ $code -ne 2 ]]; then
    echo "FAIL: $name ${*:2}: exited $code, not 2: $(cat "$tmp/err")"; fail=1
  elif [[ $lines -ne 1 ]]; then
    echo "FAIL: $name ${*:2}: $lines lines on stderr, not one:"; cat "$tmp/err"; fail=1
  elif ! grep -q -- "$flag" "$tmp/err"; then
    echo "FAIL: $name ${*:2}: the error does not name $flag: $(cat "$tmp/err")"; fail=1
  elif [[ -s "$tmp/out" ]]; then
    echo "FAIL: $name ${*:2}: wrote to stdout: $(head -3 "$tmp/out")"; fail=1
  else
    echo "ok   $name ${*:2}: $(cat "$tmp/err")"
  fi
}

for c in "${cases[@]}"; do
  bin=${c%%|*}
  read -r -a bad <<<"${c#*|}"
  if [[ ! -x "$root/$bin" ]]; then
    [[ $bin == tools/gpu/* ]] && { echo "skip $bin (built only with the CUDA toolkit)"; continue; }
    echo "FAIL: $bin is missing"; fail=1; continue
  fi
  out=$("$root/$bin" --help 2>"$tmp/err"); code=$?
  err=$(cat "$tmp/err")
  if [[ $code -ne 0 ]]; then echo "FAIL: $bin --help exited $code: $err"; fail=1; continue; fi
  if [[ -n $err ]]; then echo "FAIL: $bin --help wrote to stderr: $err"; fail=1; fi
  if ! grep -q -- "--help" <<<"$out" || [[ $(grep -c -- "--" <<<"$out") -lt 2 ]]; then
    echo "FAIL: $bin --help lists no flags:"; echo "$out" | head -5; fail=1
  fi
  # Each of the tool's own options is listed with a description ("  --name=<VALUE> - what it does").
  if grep -E -- "^  --?[a-z0-9-]+(=<[^>]*>)? *(- *)?$" <<<"$out"; then
    echo "FAIL: $bin --help lists flags without a description"; fail=1
  fi
  echo "ok   $bin --help ($(wc -l <<<"$out") lines)"

  expect_one_line_error "$bin" "--no-such-flag" "$root/$bin" --no-such-flag 1
  # Only -h and --help print the help: an unknown flag starting with h is an unknown flag (llvm::cl
  # would read "--hello" as its one-letter alias -h grouped with letters).
  expect_one_line_error "$bin" "--hello" "$root/$bin" --hello
  expect_one_line_error "$bin" "--h" "$root/$bin" --h
  expect_one_line_error "$bin" "-hx" "$root/$bin" -hx
  out=$("$root/$bin" -h 2>/dev/null); code=$?
  if [[ $code -ne 0 ]] || ! grep -q -- "--help" <<<"$out"; then echo "FAIL: $bin -h did not print the help"; fail=1; fi
  number_flag=$(grep -o -- "--[a-z-]*[= ][^ ]*$" <<<"${c#*|}" | sed 's/[= ].*//')
  expect_one_line_error "$bin" "$number_flag" "$root/$bin" "${bad[@]}"
done
rm -rf "$tmp"
exit $fail
