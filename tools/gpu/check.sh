#!/bin/bash
# The GPU check (run on the device machine from a gpu-pack/ made by tools/gpu/pack.sh):
# the CUDA kernels and the cuBLASLt bf16/fp16 linear against the CPU kernels, cuBLAS and NCCL
# on the device.
# Then PyTorch trains the check's 1.3B GPT (tools/gpu/torch_gpt_bench.py, from the working
# tree the device tool copies). Not yet here (issue 7): Loom's 1.3B step on the GPU and the
# Loom/PyTorch ratio; this script says so instead of pretending.
set -uo pipefail
cd "$(dirname "$0")"
[ -d lib ] || tar -xzf lib.tar.gz
export LOOM_TEST_PLANS="$PWD/plans"  # for cuda_executor_test
export LD_LIBRARY_PATH="$PWD/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
status=0
for t in bin/cuda_deps_test bin/cuda_kernels_test bin/lt_linear_test bin/loss_scaling_test bin/nccl_group_test bin/attention_test bin/cuda_executor_test; do
  echo "== $t"
  "$t" --gtest_brief=0 || status=1
done
echo "== PyTorch on this GPU: the check's 1.3B GPT (seq 2048), tokens/s and MFU vs measured bf16 GEMM"
python3 ../tools/gpu/torch_gpt_bench.py || status=1
echo "== not implemented yet: Loom's 1.3B training step on the GPU (the CUDA executor runs fp32 programs on one stream; no bf16 plans, streams, NCCL or trainer wiring), so no Loom/PyTorch ratio (issue 7)"
exit $status
