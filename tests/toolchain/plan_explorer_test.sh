#!/bin/bash
# loom-dump --html: the plan explorer of a compiled (t, p, d) = (2, 2, 2) GPT job, its script run
# under Node with a minimal DOM (plan_explorer_smoke.js); and a bad output path is one line.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
tmp="${TEST_TMPDIR:-/tmp}/plan_explorer"
rm -rf "$tmp" && mkdir -p "$tmp"
cat >"$tmp/c8.pbtxt" <<'SPEC'
name: "c8"
nodes: 2
devices_per_node: 4
device { kind: CPU peak_flops: 1e11 memory_bytes: 4000000000 memory_bandwidth_bytes_per_s: 1e10 }
intra_node { bandwidth_bytes_per_s: 5e9 latency_s: 2e-5 }
inter_node { bandwidth_bytes_per_s: 1e9 latency_s: 1e-4 }
parallel { tensor_parallel_size: 2 pipeline_parallel_size: 2 data_parallel_size: 2 micro_batch_size: 2 global_batch_size: 16 }
SPEC
"$root/apps/loomc" compile "$root/examples/models/gpt-tiny.pbtxt" --cluster "$tmp/c8.pbtxt" --out "$tmp/plans" --quiet
"$root/apps/loom-dump" "$tmp/plans" --html "$tmp/page.html"
out=$(node "$root/tests/toolchain/plan_explorer_smoke.js" "$tmp/page.html" 8)
echo "$out"
# The page's collective calls of rank 5 per step are loom-dump's (its per-kind totals).
page=$(sed -n 's/.*programs of rank 5, \([0-9]*\) collective calls.*/\1/p' <<<"$out")
text=$("$root/apps/loom-dump" "$tmp/plans" --view=collectives --rank 5 | awk '/ calls /{n += $2} END {print n}')
[[ -n $page && $page == "$text" ]] || { echo "FAIL: the page lists $page calls of rank 5, loom-dump $text"; exit 1; }
echo "ok: $page collective calls of rank 5, as loom-dump counts them"
if "$root/apps/loom-dump" "$tmp/plans" --html /nonexistent/dir/page.html 2>"$tmp/err"; then
  echo "FAIL: an unwritable --html path succeeded"; exit 1
fi
[[ $(wc -l <"$tmp/err") -eq 1 ]] || { echo "FAIL: not one line:"; cat "$tmp/err"; exit 1; }
echo "ok: $(cat "$tmp/err")"
