#!/bin/bash
# loom-dump --html: the plan explorer of a compiled (t, p, d) = (2, 2, 2) GPT job, its script run
# under Node with a minimal DOM (plan_explorer_smoke.js); and a bad output path is one line.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
tmp="${TEST_TMPDIR:-/tmp}/plan_explorer"
rm -rf "$tmp" && mkdir -p "$tmp"
"$root/apps/loomc" compile "$root/examples/models/gpt-tiny.pbtxt" --cluster "$root/tests/toolchain/explorer_cluster.pbtxt" --out "$tmp/plans" --quiet
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
