#!/bin/bash
# torch_gpt_bench.py on the CPU at a tiny shape: it must train (finite loss), print its line and
# write the tokens/s that check.sh divides Loom's by.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
result="${TEST_TMPDIR}/torch_result"
out=$(/usr/bin/python3 "$root/tools/gpu/torch_gpt_bench.py" --device cpu --layers 2 --hidden 64 --heads 4 \
      --seq 32 --vocab 500 --batch 2 --steps 2 --gemm-size 128 --result "$result")
echo "$out"
grep -q "PyTorch GPT .* tokens/s, .* MFU .*% of measured bf16 GEMM" <<<"$out"
grep -Eq "^tokens_per_s [0-9.]+(e[+-]?[0-9]+)?$" "$result"
