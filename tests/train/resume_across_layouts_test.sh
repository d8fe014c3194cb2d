#!/bin/bash
# Cross-layout resume for both families, a mixture of experts and a bf16 plan with sharded master
# weights (tests/train/resume_across_layouts.py).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
bin="${TEST_TMPDIR}/bin"
mkdir -p "$bin"
for tool in apps/loomc apps/loomrun apps/loom-rank apps/loom-coord apps/loom-ckpt; do
  ln -sf "$root/$tool" "$bin/$(basename "$tool")"
done
script="$root/tests/train/resume_across_layouts.py"
/usr/bin/python3 "$script" --bin "$bin" --model "$root/examples/models/gpt-tiny.pbtxt" --work "${TEST_TMPDIR}/gpt"
# LLaMA's saving run writes its checkpoints in the background (--async-save).
/usr/bin/python3 "$script" --bin "$bin" --model "$root/examples/models/llama-tiny.pbtxt" --work "${TEST_TMPDIR}/llama" \
  --async-save
/usr/bin/python3 "$script" --bin "$bin" --model "$root/examples/models/mixtral-tiny.pbtxt" --work "${TEST_TMPDIR}/moe" --moe
# bf16 with ZeRO-1: the fp32 master weights sharded (each rank saves its parts of them).
/usr/bin/python3 "$script" --bin "$bin" --model "$root/examples/models/gpt-tiny.pbtxt" --work "${TEST_TMPDIR}/bf16" \
  --precision bf16
/usr/bin/python3 "$script" --bin "$bin" --model "$root/examples/models/mixtral-tiny.pbtxt" --work "${TEST_TMPDIR}/moe-bf16" \
  --moe --precision bf16
