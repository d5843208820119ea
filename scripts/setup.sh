#!/usr/bin/env bash
# Make a virtual environment with the CPU build of torch, then the project and its test extra.
#   bash scripts/setup.sh          -> .venv:        TRL 1.12 (the trl-ppo extra): both PPO backends, the demo
#   bash scripts/setup.sh latest   -> .venv-latest: the newest TRL on the registry (no TRL PPO)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
case "${1:-compare}" in
  compare) VENV=.venv; EXTRAS="test,trl-ppo" ;;
  latest)  VENV=.venv-latest; EXTRAS="test" ;;
  *) echo "usage: bash scripts/setup.sh [compare|latest]" >&2; exit 2 ;;
esac
pip_install() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored" || true; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip_install "torch==2.13.0"   # first: a bare torch requirement would pull a multi-GB CUDA build
pip_install -e ".[$EXTRAS]"
[ "${1:-compare}" = latest ] && pip_install --upgrade trl   # the newest TRL, whatever is installed
"$VENV/bin/python" -c "import torch, trl, trl_ext; print('$VENV: torch', torch.__version__, '| trl', trl.__version__)"
