#!/usr/bin/env bash
# Set up (idempotent) and run the default test suite twice: on TRL 1.12 (.venv, both PPO backends)
# and on the newest TRL (.venv-latest, where tests that need TRL's PPO are skipped with the reason).
# Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh compare
bash scripts/setup.sh latest
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
status=0
echo "== tests on TRL 1.12 (.venv)"
.venv/bin/python -m pytest -q "$@" || status=$?
echo "== tests on the newest TRL (.venv-latest)"
.venv-latest/bin/python -m pytest -q "$@" || status=$?
exit $status
