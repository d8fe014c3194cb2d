#!/bin/bash
# torch_gpt_bench.py on the CPU at a tiny shape: it must train (finite loss) and print its line.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
out=$(/usr/bin/python3 "$root/tools/gpu/torch_gpt_bench.py" --device cpu --layers 2 --hidden 64 --heads 4 \
      --seq 32 --vocab 500 --batch 2 --steps 2 --gemm-size 128)
echo "$out"
grep -q "PyTorch GPT .* tokens/s, .* MFU .*% of measured bf16 GEMM" <<<"$out"
