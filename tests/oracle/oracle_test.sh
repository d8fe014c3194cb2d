#!/bin/bash
# The CI subset of the equivalence oracle (tests/oracle/run_oracle.py --configs all runs the
# whole matrix).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
bin="${TEST_TMPDIR}/bin"
mkdir -p "$bin"
for tool in compiler/loomc runtime/loomrun runtime/loom-rank runtime/loom-coord; do
  ln -sf "$root/$tool" "$bin/$(basename "$tool")"
done
exec /usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" \
  --model "$root/examples/models/gpt-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle" --steps 10 --configs ci
