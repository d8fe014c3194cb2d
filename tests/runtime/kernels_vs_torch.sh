#!/bin/bash
# Runs kernels_vs_torch.py with Debian's Python (the one with python3-torch).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
exec /usr/bin/python3 "$root/tests/runtime/kernels_vs_torch.py" "$root/tests/runtime/kernel_probe" "${TEST_TMPDIR}"
