#!/bin/bash
# The CI subsets of the equivalence oracle for each family (tests/oracle/run_oracle.py
# --configs all runs the whole matrix).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
bin="${TEST_TMPDIR}/bin"
mkdir -p "$bin"
for tool in apps/loomc apps/loomrun apps/loom-rank apps/loom-coord; do
  ln -sf "$root/$tool" "$bin/$(basename "$tool")"
done
# The mutant check first: a Loom whose row-parallel all-reduce is dropped (compiler:loomc-mutant)
# must fail the oracle at t = 2, so a passing oracle means something.
mutant="${TEST_TMPDIR}/mutant-bin"
mkdir -p "$mutant"
for tool in apps/loomrun apps/loom-rank apps/loom-coord; do ln -sf "$root/$tool" "$mutant/"; done
ln -sf "$root/apps/loomc-mutant" "$mutant/loomc"
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$mutant" --mutant-check \
  --model "$root/examples/models/gpt-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-mutant" --steps 3

/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" \
  --model "$root/examples/models/gpt-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle" --steps 10 --configs ci

# The LLaMA family (llama-tiny: 4 heads, 2 KV heads, untied embeddings) against an
# independent PyTorch LLaMA (llama_oracle.py), its own CI subset.
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" \
  --model "$root/examples/models/llama-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-llama" --steps 10 --configs ci

# BERT (bert-tiny: pre-LN, padded samples, masked LM plus the sentence-order head) against an
# independent PyTorch MegatronBertForPreTraining (bert_oracle.py), its CI subset (no context
# parallelism; bf16 and fp16 below).
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" \
  --model "$root/examples/models/bert-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-bert" --steps 10 --configs ci

# Mixture of experts (mixtral-tiny: 4 experts, top-2, the load-balancing loss) against an
# independent PyTorch Mixtral (mixtral_oracle.py), its CI subset; then with a capacity factor
# (assignments dropped, each rank's before its dispatch) and MoE in every other layer. The CI
# subset has expert parallelism (ep = 2, 4) with t and p; the capacity runs ep = 2 and 4 too.
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" \
  --model "$root/examples/models/mixtral-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-mixtral" --steps 10 --configs ci
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" \
  --model "$root/examples/models/mixtral-tiny-capacity.pbtxt" --work "${TEST_TMPDIR}/oracle-mixtral-capacity" \
  --steps 10 --configs t1p1d1,t2p1d1,t1p2d1-1f1b,t2p2d2-zero1,t1p1d1-accumulate-m4,t1p1d4e4,t2p2d2e2-1f1b

# bf16 plans against the oracle rounding at the same points (run_oracle.py --precision bf16:
# its tolerances), a subset of layouts per family.
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --precision bf16 \
  --model "$root/examples/models/gpt-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-bf16" --steps 10 \
  --configs t1p1d1,t2p2d1-1f1b,t2p2d2-sequence-parallel-zero1,t1p2d1v2-interleaved,t2p2d2-zero1-grad-reduce-bf16,t1p2d2-zero1-gather-in-optimizer,t1p1d1c2
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --precision bf16 \
  --model "$root/examples/models/llama-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-llama-bf16" --steps 10 \
  --configs t1p1d1,t2p1d1,t2p2d2-zero1
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --precision bf16 \
  --model "$root/examples/models/bert-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-bert-bf16" --steps 10 \
  --configs t1p1d1,t2p2d1-1f1b,t2p2d2-sequence-parallel-zero1

# fp16 plans (dynamic loss scaling) against the oracle rounding to fp16 with the same loss
# scale; an iteration whose gradients overflow is skipped by both, and one Loom skips while the
# oracle's gradients are finite fails (run_oracle.py: llama-tiny's iteration 9 at 2^16;
# bert-tiny's iterations 8 and 9 at d = 2, each rank's gradients those of its own half).
# 16-bit MoE: the oracle takes Loom's choice for a token near a routing tie (run_oracle.py
# ROUTING_TIE), so the rounding points and the 16-bit all-to-all compare tightly.
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --precision bf16 \
  --model "$root/examples/models/mixtral-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-mixtral-bf16" \
  --steps 10 --configs t1p1d1,t2p1d1-sequence-parallel,t1p1d2e2,t2p2d2e2-1f1b
# With a capacity factor: an expert over capacity keeps Loom's assignments where the two differ
# only near a weight tie (the dump's kept assignments), any other drop the same.
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --precision bf16 \
  --model "$root/examples/models/mixtral-tiny-capacity.pbtxt" --work "${TEST_TMPDIR}/oracle-mixtral-capacity-bf16" \
  --steps 10 --configs t1p1d1,t1p1d4e4,t2p2d2e2-1f1b

/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --precision fp16 \
  --model "$root/examples/models/gpt-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-fp16" --steps 10 \
  --configs t1p1d1,t2p2d1-1f1b
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --precision fp16 \
  --model "$root/examples/models/llama-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-llama-fp16" --steps 10 \
  --configs t1p1d1,t2p2d2-zero1
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --precision fp16 \
  --model "$root/examples/models/bert-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-bert-fp16" --steps 10 \
  --configs t1p1d1,t1p1d2
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --precision fp16 \
  --model "$root/examples/models/mixtral-tiny.pbtxt" --work "${TEST_TMPDIR}/oracle-mixtral-fp16" \
  --steps 10 --configs t1p1d1,t1p1d2e2
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --precision fp16 \
  --model "$root/examples/models/mixtral-tiny-capacity.pbtxt" --work "${TEST_TMPDIR}/oracle-mixtral-capacity-fp16" \
  --steps 10 --configs t1p1d2e2

# IR edited by hand is what gets compiled and trained: gpt-tiny's IR with every attention
# op's head count changed from 4 to 2 (heads of 32) and any module attribute removed, against
# the oracle with 2 heads.
ir="${TEST_TMPDIR}/edited.mlir"
grep -v dropout "$root/examples/models/gpt-tiny.pbtxt" > "${TEST_TMPDIR}/gpt-tiny-nodropout.pbtxt"
"$bin/loomc" build "${TEST_TMPDIR}/gpt-tiny-nodropout.pbtxt" |
  sed -e 's/num_heads = 4 : i64/num_heads = 2 : i64/g' -e 's/^module @"gpt-tiny" attributes {[^}]*}/module @"gpt-tiny"/' > "$ir"
grep -q 'num_heads = 2 : i64' "$ir"
! grep -q 'num_heads = 4' "$ir"
/usr/bin/python3 "$root/tests/oracle/run_oracle.py" --bin "$bin" --model "$ir" --heads 2 \
  --work "${TEST_TMPDIR}/oracle-ir" --steps 10 --configs t1p1d1,t2p1d1,t2p2d1-1f1b,t2p1d1-sequence-parallel
