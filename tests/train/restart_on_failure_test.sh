#!/bin/bash
# Jobs that restart themselves, on the same ranks or on the ranks that remain (restart_on_failure.py).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
bin="${TEST_TMPDIR}/bin"
mkdir -p "$bin"
for tool in apps/loomc apps/loomrun apps/loom-rank apps/loom-coord; do
  ln -sf "$root/$tool" "$bin/$(basename "$tool")"
done
/usr/bin/python3 "$root/tests/train/restart_on_failure.py" --bin "$bin" \
  --model "$root/examples/models/gpt-tiny.pbtxt" --work "${TEST_TMPDIR}/restart"
