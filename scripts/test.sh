#!/usr/bin/env bash
# Sets everything up (python packages, models, chromium, postgresql) and runs the whole test suite,
# slow real-model tests included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --system
if [ -z "${ECDYSIS_TEST_PG_URL:-}" ]; then
  ECDYSIS_TEST_PG_URL=$(bash scripts/start_postgres.sh | tail -n 1)
  export ECDYSIS_TEST_PG_URL
fi
mkdir -p test-artifacts
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
