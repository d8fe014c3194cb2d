#!/bin/bash
# Runs the lit suite from Bazel's runfiles: loomc and loom-dump come from //compiler, FileCheck
# and lit from Debian's llvm-19-tools.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
bin="${TEST_TMPDIR}/bin"
mkdir -p "$bin"
for tool in loomc loom-dump; do ln -sf "$root/compiler/$tool" "$bin/$tool"; done
exec /usr/bin/python3 /usr/lib/llvm-19/build/utils/lit/lit.py -sv "$root/tests/lit" \
  --param loom_bin="$bin" --param examples="$root/examples"
