#!/bin/bash
# The plan explorer in headless Chromium (plan_explorer_browser.py): the page of a (2,2,2) GPT job
# and of the PTD-P paper's 1T model on its 3072 GPUs. ./loom setup installs chromium,
# chromium-driver and python3-selenium (Debian's).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
tmp="${TEST_TMPDIR:-/tmp}/plan_explorer_browser"
rm -rf "$tmp" && mkdir -p "$tmp"
for need in /usr/bin/chromium /usr/bin/chromedriver; do
  [[ -x $need ]] || { echo "FAIL: $need is missing (./loom setup installs chromium and chromium-driver)"; exit 1; }
done
"$root/apps/loomc" compile "$root/examples/models/gpt-tiny.pbtxt" --cluster "$root/tests/toolchain/explorer_cluster.pbtxt" --out "$tmp/p8" --quiet
"$root/apps/loom-dump" "$tmp/p8" --html "$tmp/p8.html"
"$root/apps/loomc" compile "$root/examples/models/gpt-1t.pbtxt" --cluster "$root/examples/clusters/ptdp-3072.pbtxt" \
  --out "$tmp/p3072" --quiet
"$root/apps/loom-dump" "$tmp/p3072" --html "$tmp/p3072.html"
(cd "$tmp" && "$root/apps/loomc" search "$root/examples/models/gpt-tiny.pbtxt" --cluster "$root/tests/toolchain/explorer_cluster.pbtxt" \
  --top 30 --html "$tmp/search.html" >/dev/null)
HOME="$tmp" /usr/bin/python3 "$root/tests/toolchain/plan_explorer_browser.py" \
  --page "t2p2d2=$tmp/p8.html:8" --page "1t-3072=$tmp/p3072.html:3072" --search "$tmp/search.html"
