#!/bin/bash
# The GPU check (run on the device machine from a gpu-pack/ made by tools/gpu/pack.sh):
# 1. the CUDA kernels (the LLaMA family's included), attention (grouped-query too), cuBLASLt
#    bf16/fp16 linear, loss scaling, NCCL, the executor and the trainer against the CPU backend
#    (fp32 tight; bf16/fp16 within their rounding); loom-rank --device cuda on gpt-tiny,
#    llama-tiny and bert-tiny against the CPU backend; a rank stuck in a GPU kernel named by
#    the coordinator;
# 2. Loom trains the check's 1.3B GPT (seq 2048) on this GPU: tokens/s, MFU vs measured bf16 GEMM;
#    and where Loom's step goes, op by op, from a traced run (tools/gpu/trace_summary.py);
# 3. PyTorch trains the same model in the same run (tools/gpu/torch_gpt_bench.py, from the
#    working tree the device tool copies), and the Loom/PyTorch ratio is printed.
# 16-bit plans (issue 34): the executor and trainer tests run gpt-tiny's bf16 plan (the executor
# test bert-tiny's too) against the CPU backend's bf16; loom-rank on the bf16 plans of gpt-tiny,
# llama-tiny and bert-tiny against the CPU backend; the 1.3B GPT's bf16 plan (bf16 activations, stashes and weights in memory) beside its
# fp32 plan with bf16 GEMM operands.
# usage: check.sh [all | 16bit]  (16bit: the tests and the 16-bit runs with the fp32 1.3B bench
# beside them; without the fp32 loom-rank runs, the stall check, the fp32 trace, PyTorch and the
# flash kernel's run, for a second call when the lease is short)
set -uo pipefail
part=${1:-all}
want() { [ "$part" = all ] || [ "$part" = "$1" ]; }
SECONDS=0
# Each section says when it starts (seconds into the check): the lease is short.
section() { echo "== [${SECONDS} s] $*"; }
cd "$(dirname "$0")"
[ -d lib ] || tar -xzf bin-lib.tar.gz
export LOOM_TEST_PLANS="$PWD/plans"  # gpt-tiny for the executor and trainer tests
export LOOM_TEST_PLANS_BF16="$PWD/plans-bf16"
export LOOM_TEST_PLANS_BERT="$PWD/plans-bert"
export LOOM_TEST_PLANS_BERT_BF16="$PWD/plans-bert-bf16"
export LD_LIBRARY_PATH="$PWD/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
status=0
sanitizer=/usr/local/cuda/bin/compute-sanitizer
sanitized=0  # memcheck re-runs so far: at most two, so that a broken build cannot eat the lease
for t in bin/cuda_deps_test bin/cuda_kernels_test bin/lt_linear_test bin/nccl_group_test \
         bin/attention_test bin/cuda_executor_test bin/cuda_trainer_test; do
  section "$t"
  timeout 60 "$t" --gtest_brief=1 > runs.test.out 2>&1
  rc=$?
  cat runs.test.out
  if [ "$rc" -ne 0 ]; then
    status=1
    # Device time is scarce: a test that crashed or hit a CUDA error is re-run at once under
    # memcheck, so the next session has the faulting kernel and address without another
    # device run (a plain assertion failure is not: its message says enough).
    if [ -x "$sanitizer" ] && [ "$sanitized" -lt 2 ] &&
       { [ "$rc" -gt 128 ] || [ "$rc" -eq 124 ] || grep -qiE "illegal|misaligned|launch failure|CUDA error|cudaError" runs.test.out; }; then
      sanitized=$((sanitized + 1))
      echo "-- $t under compute-sanitizer (memcheck), last lines:"
      timeout 90 "$sanitizer" --tool memcheck --print-limit 5 "$t" --gtest_brief=1 2>&1 | tail -40
    fi
  fi
done
rm -rf runs && mkdir -p runs
if want all; then
for model in gpt-tiny llama-tiny bert-tiny; do
  dir=plans; [ "$model" = llama-tiny ] && dir=plans-llama; [ "$model" = bert-tiny ] && dir=plans-bert
  section "loom-rank --device cuda: 3 steps of $model, fp32 on the GPU against the CPU backend (loss per step)"
  for d in cpu cuda; do
    timeout 60 bin/loomrun --nproc 1 --plans "$dir" --steps 3 --threads 4 --device "$d" --precision fp32 \
      --loss-log "runs/$model.$d.loss" > "runs/$model.$d.out" 2>&1 ||
      { echo "loomrun --device $d failed:"; tail -5 "runs/$model.$d.out"; status=1; }
  done
  if [ -s "runs/$model.cpu.loss" ] && [ -s "runs/$model.cuda.loss" ]; then
    paste "runs/$model.cpu.loss" "runs/$model.cuda.loss" | awk '{ d = $2 - $5; if (d < 0) d = -d; rel = d / $2;
      printf "iteration %d: loss cpu %.7f cuda %.7f (rel. %.1e)\n", $1, $2, $5, rel; if (rel > 1e-4) bad = 1 }
      END { if (bad) { print "loom-rank --device cuda: loss differs from the CPU backend"; exit 1 } }' || status=1
  fi
done
fi
# bf16 plans: both backends round at the same points; summation orders differ (GEMMs, row
# reductions), so the losses agree within 2e-3 (the bf16 oracle's bound against PyTorch).
for model in gpt-tiny llama-tiny bert-tiny; do
  dir=plans-bf16; [ "$model" = llama-tiny ] && dir=plans-llama-bf16; [ "$model" = bert-tiny ] && dir=plans-bert-bf16
  section "loom-rank --device cuda: 3 steps of $model's bf16 plan (bf16 activations in memory) against the CPU backend's bf16"
  for d in cpu cuda; do
    timeout 60 bin/loomrun --nproc 1 --plans "$dir" --steps 3 --threads 4 --device "$d" \
      --loss-log "runs/$model.bf16.$d.loss" > "runs/$model.bf16.$d.out" 2>&1 ||
      { echo "loomrun --device $d (bf16 plan) failed:"; tail -5 "runs/$model.bf16.$d.out"; status=1; }
  done
  grep -h "planned\|allocated" "runs/$model.bf16.cuda.out" | head -2
  if [ -s "runs/$model.bf16.cpu.loss" ] && [ -s "runs/$model.bf16.cuda.loss" ]; then
    paste "runs/$model.bf16.cpu.loss" "runs/$model.bf16.cuda.loss" | awk '{ d = $2 - $5; if (d < 0) d = -d; rel = d / $2;
      printf "iteration %d: loss cpu %.7f cuda %.7f (rel. %.1e)\n", $1, $2, $5, rel; if (rel > 2e-3) bad = 1 }
      END { if (bad) { print "loom-rank --device cuda: the bf16 plan loss differs from the CPU backend"; exit 1 } }' || status=1
  fi
done
if want all; then
section "a rank stuck in a GPU kernel (LOOM_TEST_STALL): the job ends naming the instruction the device is at"
start=$(date +%s)
LOOM_TEST_STALL=0:20 timeout 75 bin/loomrun --nproc 1 --plans plans --steps 1000 --threads 4 --device cuda \
  > runs/stall.out 2>&1
elapsed=$(( $(date +%s) - start ))
grep -m1 "stopped in" runs/stall.out || tail -5 runs/stall.out
if grep -q "rank 0 stopped in forward_0 mb 0 at instruction .* (linear, layer 0)" runs/stall.out && [ "$elapsed" -lt 60 ]; then
  echo "stall named in ${elapsed} s"
else
  echo "the stalled GPU rank was not named within 60 s (${elapsed} s)"; status=1
fi
fi
section "Loom on this GPU: the check's 1.3B GPT (seq 2048), fp32 plan with bf16 GEMM operands (autocast), tokens/s and MFU vs measured bf16 GEMM"
timeout 150 bin/loom-gpt-bench --plans plans-1.3b --precision bf16 --steps 6 --result loom_result || status=1
section "Loom on this GPU: the same model's bf16 plan (bf16 activations, stashes and weight copies in memory)"
timeout 150 bin/loom-gpt-bench --plans plans-1.3b-bf16 --steps 6 --result loom_bf16_result || status=1
if [ -s loom_result ] && [ -s loom_bf16_result ]; then
  awk 'FNR == 1 && NR == 1 { a = $2 } FNR == 1 && NR > 1 { b = $2 }
       END { printf "bf16 plan / fp32 plan tokens/s: %.0f / %.0f = %.2f\n", b, a, b / a }' loom_result loom_bf16_result
fi
if want all; then
section "Loom's step by op on this GPU (loomrun --trace, 3 steps of the 1.3B GPT, fp32 plan, bf16 GEMMs)"
timeout 120 bin/loomrun --nproc 1 --plans plans-1.3b --steps 3 --threads 8 --device cuda --precision bf16 \
  --trace runs/trace > runs/trace.out 2>&1 && python3 ../tools/gpu/trace_summary.py runs/trace/rank_0.json --top 10 ||
  { echo "the traced run failed:"; tail -5 runs/trace.out; status=1; }
fi
section "Loom's step by op on this GPU (loomrun --trace, 3 steps of the 1.3B GPT's bf16 plan)"
timeout 120 bin/loomrun --nproc 1 --plans plans-1.3b-bf16 --steps 3 --threads 8 --device cuda \
  --trace runs/trace16 > runs/trace16.out 2>&1 && python3 ../tools/gpu/trace_summary.py runs/trace16/rank_0.json --top 10 ||
  { echo "the traced run failed:"; tail -5 runs/trace16.out; status=1; }
if want all; then
section "PyTorch on this GPU: the same model"
timeout 150 python3 ../tools/gpu/torch_gpt_bench.py --result torch_result || status=1
if [ -s loom_result ] && [ -s torch_result ]; then
  awk 'FNR == 1 && NR == 1 { loom = $2 } FNR == 1 && NR > 1 { torch = $2 }
       END { printf "Loom / PyTorch tokens/s: %.0f / %.0f = %.2f\n", loom, torch, loom / torch }' loom_result torch_result
else
  echo "Loom / PyTorch ratio: not available (a side failed above)"
  status=1
fi
fi
if want all; then
section "Loom, the same model with the tiled (flash) attention kernel instead of the unfused one"
timeout 90 bin/loom-gpt-bench --plans plans-1.3b --precision bf16 --attention flash --steps 3 || status=1
fi
section "not run here (one GPU): NCCL groups of more than one rank, pipeline links (16-bit messages included), overlapped dp buckets. not implemented: a tensor-core flash attention"
exit $status
