#!/usr/bin/env bash
# --tensorboard-dir and --metrics-file: a 2-rank job with validation writes TensorBoard event
# files that an independent reader (read_tensorboard.py: Python protobuf and its own CRC-32C)
# reads back, with Megatron's scalar names and the same losses as the JSON lines and the log.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
work="${TEST_TMPDIR}/metrics"
rm -rf "$work" && mkdir -p "$work/py"
/usr/bin/protoc --proto_path="$root/protos" --python_out="$work/py" "$root/protos/tensorboard.proto"
"$root/apps/loomc" compile "$root/tests/runtime/Inputs/gpt-tiny-nodropout.pbtxt" \
  --cluster "$root/tests/runtime/Inputs/t1p2d1.pbtxt" --out "$work/plans" --quiet
"$root/apps/loomrun" --nproc 2 --plans "$work/plans" --steps 6 --eval-interval 3 --loss-log "$work/loss.log" \
  --tensorboard-dir "$work/tb" --metrics-file "$work/metrics.jsonl" > "$work/run.log" 2>&1 || {
  cat "$work/run.log"; exit 1; }
files=("$work"/tb/events.out.tfevents.*)
[[ ${#files[@]} -eq 1 ]] || { echo "FAIL: expected one event file, found ${#files[@]}"; exit 1; }
/usr/bin/python3 "$root/tests/runtime/read_tensorboard.py" "${files[0]}" "$work/py" > "$work/tb.jsonl"
/usr/bin/python3 - "$work/tb.jsonl" "$work/metrics.jsonl" "$work/loss.log" <<'PY'
import json, math, sys
tb = [json.loads(l) for l in open(sys.argv[1])]
jl = [json.loads(l) for l in open(sys.argv[2])]
loss = {int(l.split()[0]): float(l.split()[1]) for l in open(sys.argv[3])}
train = [e for e in tb if "lm loss" in e]
valid = [e for e in tb if "lm loss validation" in e]
assert [e["step"] for e in train] == [1, 2, 3, 4, 5, 6], train
assert [e["step"] for e in valid] == [3, 6], valid
for name in ["lm loss", "learning-rate", "grad-norm", "iteration-time", "throughput", "mem-peak"]:
    assert all(name in e for e in train), name
for e in train:
    assert math.isclose(e["lm loss"], loss[e["step"]], rel_tol=1e-6), (e, loss)  # float32 in the event file
for e in valid:
    assert math.isclose(e["lm loss validation ppl"], math.exp(e["lm loss validation"]), rel_tol=1e-5), e
jtrain = [e for e in jl if "lm loss" in e]
assert [e["iteration"] for e in jtrain] == [1, 2, 3, 4, 5, 6], jl
for e in jtrain:
    assert e["lm loss"] == loss[e["iteration"]] or math.isclose(e["lm loss"], loss[e["iteration"]], rel_tol=1e-9)
print("ok: %d TensorBoard steps and %d validations read back; JSON lines agree with the loss log" % (len(train), len(valid)))
PY
