#!/bin/bash
# tests/memory/megatron_memory.py over the compiled tools (its whole table: ~1 minute).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
bin="${TEST_TMPDIR}/bin"
mkdir -p "$bin"
for tool in apps/loomc apps/loom-dump; do ln -sf "$root/$tool" "$bin/$(basename "$tool")"; done
/usr/bin/python3 "$root/tests/memory/megatron_memory.py" --bin "$bin" --devices "$root/examples/devices" \
  --work "${TEST_TMPDIR}/megatron-memory"
