"""Checkpoints, resume after SIGKILL, and trackers of the scratch trainer (CPU, one thread)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trl_ext.ppo import PPOConfig, PPOTrainer
from trl_ext.ppo.checkpoint import CheckpointError
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def _ppo(artifacts, out, *extra):
    return [
        sys.executable,
        "-m",
        "trl_ext",
        "ppo",
        "--policy",
        str(artifacts["policy"]),
        "--reward",
        str(artifacts["reward"]),
        "--out",
        str(out),
        "--batch-size",
        "8",
        "--total-episodes",
        "96",
        "--save-steps",
        "2",
        "--save-total-limit",
        "3",
        "--probe-every",
        "0",
        "--eval-n",
        "20",
        *extra,
    ]


def test_sigkill_then_resume_ends_with_the_same_weights(trained_artifacts, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run = subprocess.run(_ppo(trained_artifacts, whole), capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    kept = sorted((p.name for p in whole.glob("checkpoint-*")), key=lambda name: int(name.split("-")[1]))
    assert kept == ["checkpoint-8", "checkpoint-10", "checkpoint-12"]  # save_total_limit 3, the last at the end

    proc = subprocess.Popen(
        _ppo(trained_artifacts, killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT
    )
    deadline = time.time() + 300
    while not (killed / "checkpoint-4" / "trainer_state.json").exists() and time.time() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and not (killed / "summary.json").exists()

    resumed = subprocess.run(
        _ppo(trained_artifacts, killed, "--resume-from-checkpoint", "latest"),
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    heads = [load_file(str(d / "value_head.safetensors")) for d in (whole, killed)]
    assert all(torch.allclose(heads[0][k], heads[1][k], atol=1e-6, rtol=0) for k in heads[0])
    updates = [json.loads(line)["update"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert updates == list(range(1, 13))  # the log has each update once, across the kill


def _trainer(tokenizer, out, **options):
    from datasets import Dataset

    from trl_ext.tasks.doubling.models import build_policy

    data = Dataset.from_dict({"input_ids": [tokenizer("S数字:1234x2=")["input_ids"]] * 16})
    args = doubling_ppo_config(
        **{"batch_size": 4, "total_episodes": 16, "num_ppo_epochs": 1, "output_dir": str(out), **options}
    )
    return PPOTrainer(
        build_policy(tokenizer),
        lambda completions, **kw: [float(len(c)) for c in completions],
        args=args,
        processing_class=tokenizer,
        train_dataset=data,
    )


def test_bad_resumes_are_named_and_half_written_checkpoints_skipped(tokenizer, tmp_path):
    with pytest.raises(CheckpointError, match="resume_from_checkpoint '/nowhere' does not exist"):
        _trainer(tokenizer, tmp_path, resume_from_checkpoint="/nowhere")
    with pytest.raises(CheckpointError, match="no complete checkpoint in"):
        _trainer(tokenizer, tmp_path, resume_from_checkpoint="latest")
    _trainer(tokenizer, tmp_path, save_steps=2).train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    with pytest.raises(CheckpointError, match="was written with batch_size=4; this run has batch_size=2"):
        _trainer(tokenizer, tmp_path, resume_from_checkpoint="latest", batch_size=2)
    with pytest.raises(CheckpointError, match="another model: it lacks critic_backbone"):
        _trainer(tokenizer, tmp_path, resume_from_checkpoint="latest", separate_critic=True)
    (tmp_path / "checkpoint-6").mkdir()  # killed while saving: no trainer_state.json
    with pytest.warns(UserWarning, match="skipping .*checkpoint-6: it has no trainer_state.json"):
        resumed = _trainer(tokenizer, tmp_path, resume_from_checkpoint="latest")
    assert resumed.resumed_from.name == "checkpoint-4" and resumed.update_index == 4 and resumed.episode == 16
    assert resumed.train() == []  # nothing left of the budget


def test_unknown_tracker_lists_the_known_ones():
    with pytest.raises(
        ValueError,
        match=r"unknown tracker\(s\) tensorbored in report_to: known are none, all, .*"
        r"tensorboard.*wandb",
    ):
        PPOConfig(report_to="tensorbored")


def test_tensorboard_event_file_holds_trl_metric_names(tokenizer, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    history = _trainer(tokenizer, tmp_path, report_to="tensorboard").train()
    events = list(tmp_path.rglob("events.out.tfevents.*"))
    assert events, list(tmp_path.rglob("*"))
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    assert {"objective/scores", "objective/kl", "loss/policy_avg", "loss/value_avg"} <= set(tags)
    assert [e.step for e in accumulator.Scalars("objective/scores")] == [1, 2, 3, 4]
    for tag in ("objective/scores", "loss/policy_avg", "loss/value_avg"):  # each update's own values
        logged = [e.value for e in accumulator.Scalars(tag)]
        assert logged == pytest.approx([h[tag] for h in history], rel=1e-6, abs=1e-7), tag
