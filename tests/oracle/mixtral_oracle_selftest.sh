#!/bin/bash
# The Mixtral reference's self-test (mixtral_oracle_selftest.py).
set -euo pipefail
exec /usr/bin/python3 "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/oracle/mixtral_oracle_selftest.py"
