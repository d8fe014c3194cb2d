#!/usr/bin/env bash
# Every binary answers --help: exit 0, its flags listed on stdout, nothing on stderr.
set -uo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
fail=0
for bin in compiler/loomc compiler/loom-dump compiler/loom-generate data/loom-preprocess runtime/loomrun \
    runtime/loom-rank runtime/loom-coord bench/sgemm_peak; do
  out=$("$root/$bin" --help 2>/tmp/help_err.$$); code=$?
  err=$(cat /tmp/help_err.$$)
  if [[ $code -ne 0 ]]; then echo "FAIL: $bin --help exited $code: $err"; fail=1; continue; fi
  if [[ -n $err ]]; then echo "FAIL: $bin --help wrote to stderr: $err"; fail=1; fi
  if ! grep -q -- "--help" <<<"$out" || [[ $(grep -c -- "--" <<<"$out") -lt 2 ]]; then
    echo "FAIL: $bin --help lists no flags:"; echo "$out" | head -5; fail=1
  fi
  echo "ok   $bin --help ($(wc -l <<<"$out") lines)"
done
rm -f /tmp/help_err.$$
exit $fail
