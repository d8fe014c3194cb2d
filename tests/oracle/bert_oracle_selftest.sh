#!/bin/bash
# The BERT reference's self-test (bert_oracle_selftest.py).
set -euo pipefail
exec /usr/bin/python3 "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/oracle/bert_oracle_selftest.py"
