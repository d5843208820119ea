#!/usr/bin/env bash
# Set up (idempotent) and run the default test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} .venv/bin/python -m pytest -q "$@"
