"""The ``scratch-ALGO`` backends of ``ppo``/``compare``: our trainer configured as TRL's critic-free rows, and the
best critic-free setting found (``scratch-rloo-tuned``)."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trl_ext.commands.backends import RUNNERS
from trl_ext.doubling.ppo_settings import doubling_ppo_config

ROOT = Path(__file__).resolve().parents[1]
SCRATCH_ROWS = sorted(name for name in RUNNERS if name.startswith("scratch-"))


@pytest.mark.parametrize("backend", SCRATCH_ROWS)
def test_each_row_is_a_valid_critic_free_config(backend):
    base = doubling_ppo_config()
    cfg = replace(base, **RUNNERS[backend].build.keywords["algorithm"](base))  # PPOConfig checks itself
    assert cfg.advantage_estimator == backend.split("-")[1]
    assert cfg.max_grad_norm == 1.0  # as TRL's Trainer clips


def test_the_tuned_rloo_row_is_rloo_with_two_epochs_at_lr_1e3():
    base = doubling_ppo_config()
    rloo = replace(base, **RUNNERS["scratch-rloo"].build.keywords["algorithm"](base))
    tuned = replace(base, **RUNNERS["scratch-rloo-tuned"].build.keywords["algorithm"](base))
    assert (tuned.num_ppo_epochs, tuned.learning_rate) == (2, 1e-3)
    assert replace(tuned, num_ppo_epochs=1, learning_rate=base.learning_rate) == rloo


def test_the_tuned_rloo_row_runs_from_the_cli(trained_artifacts, tmp_path):
    out = tmp_path / "tuned"
    run = subprocess.run([sys.executable, "-m", "trl_ext.commands.cli", "ppo", "--backend", "scratch-rloo-tuned",
                          "--policy", str(trained_artifacts["policy"]), "--reward", str(trained_artifacts["reward"]),
                          "--out", str(out), "--batch-size", "16", "--total-episodes", "32", "--probe-every", "0",
                          "--eval-n", "20"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in lines] == [1, 2] and "loss/value_avg" not in lines[-1]  # no critic
    assert (out / "model.safetensors").exists() and json.loads((out / "summary.json").read_text())["episodes"] == 32
