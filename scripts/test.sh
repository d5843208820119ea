#!/usr/bin/env bash
# Set up (idempotent) and run the default test suite twice, side by side on the two cores:
# on TRL 1.12 (.venv, both PPO backends) and on the newest TRL (.venv-latest, where the tests that
# need TRL's PPO are skipped with the reason). Each run has one torch thread and its own temp dir;
# the logs are printed whole, one after the other. Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh compare
bash scripts/setup.sh latest
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
logs=$(mktemp -d)
tmp=${TMPDIR:-/tmp}
.venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$tmp/trl-ext-pytest-trl112" "$@" \
    > "$logs/trl112.log" 2>&1 & compare=$!
.venv-latest/bin/python -m pytest -q -p no:cacheprovider --basetemp "$tmp/trl-ext-pytest-latest" "$@" \
    > "$logs/latest.log" 2>&1 & latest=$!
status=0
wait $compare || status=$?
wait $latest || status=$?
echo "== tests on TRL 1.12 (.venv)"
cat "$logs/trl112.log"
echo "== tests on the newest TRL (.venv-latest)"
cat "$logs/latest.log"
rm -rf "$logs"
exit $status
