#!/usr/bin/env bash
# Create .venv with the CPU build of torch, then the project and its test extra.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import torch, trl, trl_ext; print('torch', torch.__version__, '| trl', trl.__version__)"
