"""The ``scratch-ALGO`` backends of ``ppo``/``compare``: our trainer configured as TRL's critic-free rows, and the
best critic-free settings found (``scratch-rloo-tuned``, ``scratch-grpo-tuned``; TRL's trainers run them as
``rloo-tuned``, ``grpo-tuned``)."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trl_ext.doubling.presets import BACKENDS
from trl_ext.doubling.ppo_settings import doubling_ppo_config

ROOT = Path(__file__).resolve().parents[1]
SCRATCH_ROWS = sorted(name for name in BACKENDS if name.startswith("scratch-"))


@pytest.mark.parametrize("backend", SCRATCH_ROWS)
def test_each_row_is_a_valid_critic_free_config(backend):
    base = doubling_ppo_config()
    cfg = BACKENDS[backend].row_config(base)  # PPOConfig checks itself
    assert cfg.advantage_estimator == backend.split("-")[1]
    assert cfg.max_grad_norm == 1.0  # as TRL's Trainer clips


def test_the_tuned_rloo_row_is_rloo_with_two_epochs_at_lr_1e3():
    base = doubling_ppo_config()
    rloo = BACKENDS["scratch-rloo"].row_config(base)
    tuned = BACKENDS["scratch-rloo-tuned"].row_config(base)
    assert (tuned.num_ppo_epochs, tuned.learning_rate) == (2, 1e-3)
    assert replace(tuned, num_ppo_epochs=1, learning_rate=base.learning_rate) == rloo


def test_the_tuned_grpo_row_is_grpo_with_two_epochs_at_lr_1e3_scaled_by_the_batch():
    base = doubling_ppo_config()
    grpo = BACKENDS["scratch-grpo"].row_config(base)
    tuned = BACKENDS["scratch-grpo-tuned"].row_config(base)
    assert (tuned.num_ppo_epochs, tuned.learning_rate, tuned.scale_rewards) == (2, 1e-3, "batch")
    assert replace(tuned, num_ppo_epochs=1, learning_rate=base.learning_rate, scale_rewards="group") == grpo


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_the_quick_rows_keep_one_step_a_batch_at_lr_7e4(kind):
    base = doubling_ppo_config()
    as_trl = BACKENDS[f"scratch-{kind}"].row_config(base)
    quick = BACKENDS[f"scratch-{kind}-quick"].row_config(base)
    assert (quick.num_ppo_epochs, quick.num_mini_batches, quick.learning_rate) == (1, 1, 7e-4)
    scaled = {"scale_rewards": "batch"} if kind == "grpo" else {}
    assert quick == replace(as_trl, learning_rate=7e-4, **scaled)


def _trl_tuned_runner(kind, tokenizer, tmp_path, total_episodes):
    from trl_ext.runners import RUNNERS, RunInputs
    from trl_ext.doubling.artifacts import load_policy, save_artifact
    from trl_ext.doubling.models import build_policy
    from trl_ext.doubling.task import ppo_prompt_dataset

    save_artifact(build_policy(tokenizer), tokenizer, tmp_path / "policy")  # their reference loads from its path
    policy, _ = load_policy(tmp_path / "policy")
    base = doubling_ppo_config(total_episodes=total_episodes, output_dir=str(tmp_path / "out"))
    inputs = RunInputs(base, policy, tokenizer, lambda completions, **_: [0.0] * len(completions),
                       lambda n: ppo_prompt_dataset(tokenizer, n, 0))
    backend = BACKENDS[f"{kind}-tuned"]
    return base, RUNNERS[backend.runner](replace(inputs, config=backend.row_config(base)))


@pytest.mark.trl_api  # TRL's GRPOConfig and RLOOConfig
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_trls_tuned_rows_run_our_rows_config(kind, tokenizer, tmp_path):
    """TRL's row and ours of a name read one config: epochs are TRL's iterations, each an optimizer step."""
    from trl_ext.runners import GROUP_SIZE

    base, runner = _trl_tuned_runner(kind, tokenizer, tmp_path, total_episodes=64)
    ours = BACKENDS[f"scratch-{kind}-tuned"].row_config(base)
    args = runner.trainer.args
    assert (args.num_iterations, args.max_steps, args.learning_rate) == (2, 2, ours.learning_rate)
    assert args.num_generations == ours.num_generations == GROUP_SIZE
    if kind == "grpo":
        assert (args.scale_rewards, args.beta) == ("batch", ours.beta)
    else:  # RLOO's beta is a KL in the reward
        assert args.beta == ours.kl_coef and ours.beta == 0


@pytest.mark.trl_api  # TRL's GRPOTrainer's loop
def test_trls_tuned_row_reports_a_batch_after_its_last_optimizer_step(tokenizer, tmp_path):
    """Two optimizer steps a generated batch: an update is reported (and probed, or stopped at) once the second is
    taken, never with the policy half-way through a batch."""
    base, runner = _trl_tuned_runner("grpo", tokenizer, tmp_path, total_episodes=2 * 64)
    seen = []
    runner.train(lambda update, stats: seen.append((update, runner.trainer.state.global_step, stats["episode"])))
    assert seen == [(1, 2, 64), (2, 4, 128)]


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


@pytest.mark.parametrize("backend", ["scratch-grpo-tuned", "scratch-rloo-tuned"])
def test_the_tuned_rows_learn_the_requested_charset(backend, trained_artifacts):
    """80 updates of 64 completions (8 prompts, 8 each) at the row's setting, without a critic, must clearly lift
    the requested-charset rate (measured on the suite's policy, seeds 0 and 1: 0.35 -> 0.94-1.00; at 40 updates
    GRPO's had not started: 0.385)."""
    from trl_ext.doubling.artifacts import load_classifier, load_policy
    from trl_ext.doubling.evaluate import evaluate_policy
    from trl_ext.doubling.rewards import doubling_classifier_reward
    from trl_ext.doubling.task import ppo_prompt_dataset
    from trl_ext.ppo.trainer import PPOTrainer

    policy, tok = load_policy(trained_artifacts["policy"])
    classifier, classifier_tok = load_classifier(trained_artifacts["reward"])
    before = evaluate_policy(policy, tok, n=200, sample=False)["greedy"]["charset_acc"]
    base = doubling_ppo_config(skip_special_tokens=False, total_episodes=64 * 80, seed=1)
    cfg = BACKENDS[backend].row_config(base)
    trainer = PPOTrainer(policy, doubling_classifier_reward(classifier, classifier_tok), args=cfg,
                         train_dataset=ppo_prompt_dataset(tok, cfg.total_episodes, seed=1), processing_class=tok)
    assert trainer.actor_critic.value_head is None and trainer.actor_critic.critic_backbone is None
    trainer.train()
    after = evaluate_policy(trainer.policy, tok, n=200, sample=False)["greedy"]["charset_acc"]
    assert after >= before + 0.4, (before, after)


def test_compare_reuses_a_finished_row_only_while_its_config_is_the_same(tmp_path, monkeypatch):
    """A row's settings live in code: a finished run of a row that has since changed is run again, not reused."""
    from trl_ext.doubling import presets
    from trl_ext.doubling.pipeline import _finished
    from trl_ext.doubling.ppo_run import ppo_options, run_record

    opts = ppo_options(doubling_ppo_config(), policy="p", reward="r", out=str(tmp_path),
                       backend="scratch-rloo-quick")
    assert run_record(opts)["trained_with"]["learning_rate"] == 7e-4  # the row's, not the flags' 3e-4
    (tmp_path / "summary.json").write_text(json.dumps({"config": run_record(opts)}))
    assert _finished(tmp_path, "summary.json", run_record(opts)) is not None
    monkeypatch.setitem(presets.BACKENDS, "scratch-rloo-quick",
                        presets.Backend("scratch", lambda cfg: {"learning_rate": 5e-4}))
    assert _finished(tmp_path, "summary.json", run_record(opts)) is None
