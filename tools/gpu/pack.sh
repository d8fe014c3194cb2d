#!/bin/bash
# Packs the GPU test binaries and the shared libraries they need that the GPU machine lacks
# into gpu-pack/, for the device tool's `carry` (a machine without Bazel). The CUDA libraries
# (cudart, cuBLAS, NCCL: hundreds of MB) are the GPU machine's own (CUDA 13 there too), so
# they stay behind. usage: tools/gpu/pack.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel-4 build //tests/cuda:cuda_kernels_test //tests/cuda:lt_linear_test //tests/cuda:nccl_group_test //tests/cuda:attention_test //tests/cuda:cuda_executor_test //tests/cuda:cuda_trainer_test //tools/gpu:loom-gpt-bench //apps:loomrun //apps:loom-coord //apps:loom-rank //apps:loomc //tests/toolchain:cuda_deps_test
rm -rf gpu-pack && mkdir -p gpu-pack/bin gpu-pack/lib
for t in tests/cuda/cuda_kernels_test tests/cuda/lt_linear_test tests/cuda/nccl_group_test tests/cuda/attention_test tests/cuda/cuda_executor_test tests/cuda/cuda_trainer_test tools/gpu/loom-gpt-bench apps/loomrun apps/loom-coord apps/loom-rank tests/toolchain/cuda_deps_test; do
  cp -L "bazel-bin/$t" gpu-pack/bin/
  ldd "bazel-bin/$t" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) ;;
      libcudart.so*|libcublas*|libnccl.so*) ;;
      *) cp -Ln "$lib" gpu-pack/lib/ 2>/dev/null || true ;;
    esac
  done
done
# The plans, compiled here (loomc and LLVM stay behind): gpt-tiny for the executor and trainer
# tests, the 1.3B GPT on one H200 for the benchmark.
bazel-bin/apps/loomc compile tests/runtime/Inputs/gpt-tiny-nodropout.pbtxt \
  --cluster tests/runtime/Inputs/t1p1d1.pbtxt --out gpu-pack/plans --quiet
bazel-bin/apps/loomc compile examples/models/llama-tiny.pbtxt \
  --cluster tests/runtime/Inputs/t1p1d1.pbtxt --out gpu-pack/plans-llama --quiet
bazel-bin/apps/loomc compile examples/models/gpt-1.3b.pbtxt \
  --cluster examples/clusters/h200-1.pbtxt --out gpu-pack/plans-1.3b --quiet
# The bf16 plans (issue 34: 16-bit activations, stashes and weight copies in memory).
bazel-bin/apps/loomc compile tests/runtime/Inputs/gpt-tiny-nodropout.pbtxt \
  --cluster tests/runtime/Inputs/t1p1d1_bf16.pbtxt --out gpu-pack/plans-bf16 --quiet
bazel-bin/apps/loomc compile examples/models/llama-tiny.pbtxt \
  --cluster tests/runtime/Inputs/t1p1d1_bf16.pbtxt --out gpu-pack/plans-llama-bf16 --quiet
bazel-bin/apps/loomc compile examples/models/gpt-1.3b.pbtxt \
  --cluster examples/clusters/h200-1-bf16.pbtxt --out gpu-pack/plans-1.3b-bf16 --quiet
# bert-tiny (padded keys, segment embeddings, the sentence-order head), fp32 and bf16.
bazel-bin/apps/loomc compile examples/models/bert-tiny.pbtxt \
  --cluster tests/runtime/Inputs/t1p1d1.pbtxt --out gpu-pack/plans-bert --quiet
bazel-bin/apps/loomc compile examples/models/bert-tiny.pbtxt \
  --cluster tests/runtime/Inputs/t1p1d1_bf16.pbtxt --out gpu-pack/plans-bert-bf16 --quiet
# The programs and libraries go compressed (OpenBLAS and oneDNN are ~35-40 MB each, the programs
# ~30 MB) to stay under the device tool's 64 MiB working-tree limit; check.sh unpacks them there.
tar -C gpu-pack -czf gpu-pack/bin-lib.tar.gz bin lib && rm -rf gpu-pack/bin gpu-pack/lib
cp tools/gpu/check.sh gpu-pack/
du -sh gpu-pack
