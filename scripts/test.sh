#!/usr/bin/env bash
# Set up both virtual environments (idempotent, side by side), then run the test suite across two TRL
# lines side by side on the two cores, one torch thread each: TRL 1.12 (.venv: TRL's PPO) and the newest
# TRL (.venv-latest). Tests that depend on the TRL line run where they apply: `trl_api` on both lines,
# `needs_trl_ppo` on 1.12 only. TRL-agnostic tests run once, split between the two sides to balance them
# (tests/conftest.py, `trl112_side`). The logs are printed whole, one after the other. Extra arguments go
# to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
setup_logs=$(mktemp -d)
bash scripts/setup.sh compare > "$setup_logs/compare.log" 2>&1 & compare=$!
bash scripts/setup.sh latest > "$setup_logs/latest.log" 2>&1 & latest=$!
status=0
wait $compare || status=$?
wait $latest || status=$?
cat "$setup_logs/compare.log" "$setup_logs/latest.log"
rm -rf "$setup_logs"
[ $status -eq 0 ] || exit $status
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
logs=$(mktemp -d)
tmp=${TMPDIR:-/tmp}
.venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$tmp/trl-ext-pytest-trl112" \
    -m "needs_trl_ppo or trl_api or trl112_side" "$@" > "$logs/trl112.log" 2>&1 & compare=$!
.venv-latest/bin/python -m pytest -q -p no:cacheprovider --basetemp "$tmp/trl-ext-pytest-latest" \
    -m "not trl112_side" "$@" > "$logs/latest.log" 2>&1 & latest=$!
wait $compare || status=$?
wait $latest || status=$?
echo "== TRL 1.12 (.venv): TRL's PPO, the tests of TRL's API, and the agnostic tests of its side"
cat "$logs/trl112.log"
echo "== the newest TRL (.venv-latest): the tests of TRL's API and the other agnostic tests"
cat "$logs/latest.log"
rm -rf "$logs"
exit $status
