#!/usr/bin/env bash
# benchmarks/gpu.py on a GPU machine that has torch but no package registry (the lent machine here).
#   bash benchmarks/gpu_run.sh --download     # here: the wheels it lacks into .whl/ (git-ignored), carried along
#   bash benchmarks/gpu_run.sh [gpu.py options]   # there: install them into folders under $SITE, then run gpu.py
# TRL 1.12 (the trl-ppo row) and the newest TRL (every other row) go to folders of their own; gpu.py puts the one
# a row needs first on that row's PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/gpu-site}

if [[ "${1:-}" == "--download" ]]; then
    platform="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any
              --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
    # shellcheck disable=SC2086
    python -m pip download -q $platform -d "$WHEELS/common" transformers==5.24.0 tokenizers==0.23.3 \
        datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0 peft==0.21.2
    # shellcheck disable=SC2086
    python -m pip download -q $platform -d "$WHEELS/trl112" trl==1.12.0
    # shellcheck disable=SC2086
    python -m pip download -q $platform -d "$WHEELS/trl116" trl==1.16.0
    exit 0
fi

PY=${PYTHON:-python3}
for part in common trl112 trl116; do
    [[ -d "$SITE/$part" ]] || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE/$part" \
        "$WHEELS/$part"/*.whl
done
export PYTHONPATH="$SITE/common${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)"
exec "$PY" benchmarks/gpu.py --trl-ppo "$SITE/trl112" --trl-latest "$SITE/trl116" "$@"
