import json
import math
import subprocess
import sys

import pytest
import torch
from recomputation import RecomputeCounter

from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config


@pytest.fixture()
def pieces(trained_artifacts):
    from trl_ext.tasks.doubling.artifacts import load_classifier, load_policy
    from trl_ext.tasks.doubling.rewards import doubling_classifier_reward

    policy, tok = load_policy(trained_artifacts["policy"])
    clf, clf_tok = load_classifier(trained_artifacts["reward"])
    return policy, tok, doubling_classifier_reward(clf, clf_tok)


@pytest.mark.needs_trl_ppo
@pytest.mark.parametrize("separate_critic", [False, True])
def test_trl_trainer_few_updates(pieces, tmp_path, separate_critic):
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset
    from trl_ext.trl_compat.backend import build_trl_trainer, save_trl_policy

    policy, tok, reward = pieces
    scored = []  # each call's scores, in the order TRL asked for them

    def recording(prompts, completions, **columns):
        scored.extend(reward(prompts=prompts, completions=completions, **columns))
        return scored[-len(completions) :]

    cfg = doubling_ppo_config(
        batch_size=8, num_mini_batches=2, num_ppo_epochs=2, total_episodes=16, separate_critic=separate_critic
    )
    trainer = build_trl_trainer(cfg, policy, tok, recording, ppo_prompt_dataset(tok, 16, 0), tmp_path)
    value_model = trainer.accelerator.unwrap_model(trainer.model).value_model
    assert (value_model.backbone is policy.transformer) != separate_critic
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    head_before = value_model.with_value_head.v_head.summary.weight.detach().clone()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "objective/scores" in h]
    assert len(logs) == 2 and [h["episode"] for h in logs] == [8, 16]  # the configured two updates of 8
    assert all(math.isfinite(v) for h in logs for v in h.values() if isinstance(v, float))
    # each update's logged score is the reward of its own 8 rollouts
    assert len(scored) == 16
    for update, h in enumerate(logs):
        assert h["objective/scores"] == pytest.approx(sum(scored[8 * update : 8 * update + 8]) / 8, abs=1e-6)
    assert any(not torch.equal(before[n], p) for n, p in policy.named_parameters())
    assert not torch.equal(head_before, value_model.with_value_head.v_head.summary.weight)
    out = save_trl_policy(trainer, tok, tmp_path / "policy")
    from trl_ext.tasks.doubling.artifacts import load_policy

    again, _ = load_policy(out)
    assert torch.equal(again.lm_head.weight, policy.lm_head.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]  # TRL left nothing else behind


@pytest.mark.needs_trl_ppo
def test_trl_backend_recomputes_activations_when_asked(pieces, tmp_path, monkeypatch):
    """TRL 1.12's PPOTrainer.train() never reads its gradient_checkpointing argument: the backend turns it on, and
    every backward runs the blocks' forwards again (counted at the MLP's forward: module hooks stay outside the
    checkpoint), once for the policy's pass and once for the critic's on the shared backbone."""
    from transformers.models.gpt2 import modeling_gpt2

    from trl_ext.tasks.doubling.task import ppo_prompt_dataset
    from trl_ext.trl_compat.backend import build_trl_trainer

    counter = RecomputeCounter(monkeypatch, modeling_gpt2.GPT2MLP)
    policy, tok, reward = pieces
    cfg = doubling_ppo_config(batch_size=8, total_episodes=8, gradient_checkpointing=True)
    trainer = build_trl_trainer(cfg, policy, tok, reward, ppo_prompt_dataset(tok, 8, 0), tmp_path)
    counter.watch(trainer.accelerator)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer.train()
    value_model = trainer.accelerator.unwrap_model(trainer.model).value_model
    assert value_model.backbone is policy.transformer  # one backbone: its blocks serve both passes
    assert counter.counts["backwards"] == cfg.num_ppo_epochs * cfg.num_mini_batches
    assert counter.counts["recomputed"] == counter.counts["backwards"] * 2 * len(policy.transformer.h), counter.counts
    assert any(not torch.equal(before[n], p) for n, p in policy.named_parameters())


@pytest.mark.needs_trl_ppo
def test_trl_backend_learns_requested_charset(pieces, tmp_path):
    """30 TRL updates of 64 must clearly lift the requested-charset rate (the reward is wired right)."""
    from trl_ext.tasks.doubling.evaluate import evaluate_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset
    from trl_ext.trl_compat.backend import build_trl_trainer

    policy, tok, reward = pieces
    before = evaluate_policy(policy, tok, n=200, sample=False)["greedy"]["charset_acc"]
    cfg = doubling_ppo_config(
        batch_size=64,
        total_episodes=64 * 30,
        learning_rate=3e-4,
        separate_critic=True,
        lr_scheduler_type="constant",
        seed=1,
    )
    trainer = build_trl_trainer(cfg, policy, tok, reward, ppo_prompt_dataset(tok, cfg.total_episodes, 1), tmp_path)
    trainer.train()
    after = evaluate_policy(policy, tok, n=200, sample=False)["greedy"]["charset_acc"]
    assert after >= before + 0.25, (before, after)


def _cli(*args):
    import os

    return subprocess.run(
        [sys.executable, "-m", "trl_ext.commands.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.parametrize("backend", [pytest.param("trl", marks=pytest.mark.needs_trl_ppo), "scratch"])
def test_ppo_cli_tiny(trained_artifacts, tmp_path, backend):
    out = tmp_path / backend
    run = _cli(
        "ppo",
        "--backend",
        backend,
        "--policy",
        str(trained_artifacts["policy"]),
        "--reward",
        str(trained_artifacts["reward"]),
        "--out",
        str(out),
        "--batch-size",
        "8",
        "--total-episodes",
        "16",
        "--probe-every",
        "1",
        "--probe-n",
        "10",
        "--eval-n",
        "20",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"ppo[{backend}]: greedy exact=" in run.stdout
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in lines] == [1, 2] and all("probe/exact" in r for r in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 16 and f"greedy exact={summary['greedy']['exact']:.3f} " in run.stdout
    # the summary scores the saved policy: its greedy answers to the same 20 held-out prompts, scored again
    from trl_ext.tasks.doubling.artifacts import load_policy
    from trl_ext.tasks.doubling.evaluate import evaluate_policy

    greedy = evaluate_policy(*load_policy(out), n=20, seed=0, sample=False)["greedy"]
    assert {k: greedy[k] for k in summary["greedy"]} == summary["greedy"]
    assert (out / "model.safetensors").exists() and (out / "value_head.safetensors").exists()
    assert json.loads((out / "eval.json").read_text())["n"] == 20


def test_ppo_cli_bad_input(trained_artifacts, tmp_path):
    policy, reward = str(trained_artifacts["policy"]), str(trained_artifacts["reward"])
    run = _cli("ppo", "--backend", "trl", "--policy", policy, "--out", str(tmp_path / "a"))
    assert (
        run.returncode == 2
        and "give --reward (a classifier directory), --reward-fn (module:callable) or --reward-url" in run.stderr
    )
    run = _cli(
        "ppo",
        "--policy",
        policy,
        "--reward",
        reward,
        "--out",
        str(tmp_path / "b"),
        "--batch-size",
        "10",
        "--num-mini-batches",
        "4",
    )
    assert run.returncode == 2 and "not divisible by num_mini_batches" in run.stderr
    run = _cli("ppo", "--policy", policy, "--reward", policy, "--out", str(tmp_path / "c"))
    assert run.returncode == 2 and "not a sequence classifier" in run.stderr
    # a 2-label classifier cannot say which of the 3 charsets was asked for
    from transformers import AutoModelForSequenceClassification

    two = AutoModelForSequenceClassification.from_pretrained(reward, num_labels=2, ignore_mismatched_sizes=True)
    two.save_pretrained(tmp_path / "two")
    from trl_ext.tasks.doubling.tokenizer import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path / "two")
    run = _cli("ppo", "--policy", policy, "--reward", str(tmp_path / "two"), "--out", str(tmp_path / "d"))
    assert run.returncode == 2 and "has 2 labels" in run.stderr
    # a policy whose vocabulary does not match the tokenizer
    from trl_ext.tasks.doubling.artifacts import load_policy

    model, tok = load_policy(policy)
    model.resize_token_embeddings(30)
    model.save_pretrained(tmp_path / "small")
    tok.save_pretrained(tmp_path / "small")
    run = _cli("ppo", "--policy", str(tmp_path / "small"), "--reward", reward, "--out", str(tmp_path / "e"))
    assert run.returncode == 2 and "30 embeddings but its tokenizer has 42" in run.stderr
    for name in "abcde":
        assert not (tmp_path / name).exists()  # nothing written before the checks


def test_ppo_cli_with_a_user_reward_function(trained_artifacts, tmp_path):
    """`--reward-fn file.py:callable` (or module:callable) runs the user's own TRL-style reward function."""
    (tmp_path / "my_reward.py").write_text(
        "def shorter_is_better(completions, completion_ids, label, **kwargs):\n"
        "    assert len(label) == len(completions)\n"
        "    return [-len(ids) / 8 for ids in completion_ids]\n"
    )
    out = tmp_path / "run"
    run = _cli(
        "ppo",
        "--policy",
        str(trained_artifacts["policy"]),
        "--reward-fn",
        f"{tmp_path / 'my_reward.py'}:shorter_is_better",
        "--out",
        str(out),
        "--batch-size",
        "8",
        "--total-episodes",
        "16",
        "--probe-every",
        "0",
        "--eval-n",
        "20",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(-1.0 <= r["objective/scores"] < 0 for r in lines)
    # the function scored the trained rollouts' own ids: their mean length is the loss mask's
    assert all(r["objective/scores"] == pytest.approx(-r["val/response_length"] / 8, rel=1e-6) for r in lines), lines
    bad = _cli(
        "ppo",
        "--policy",
        str(trained_artifacts["policy"]),
        "--reward-fn",
        "no_such_module:f",
        "--out",
        str(tmp_path / "bad"),
    )
    assert bad.returncode == 2 and "cannot import 'no_such_module'" in bad.stderr
    bad = _cli(
        "ppo",
        "--policy",
        str(trained_artifacts["policy"]),
        "--reward-fn",
        f"{tmp_path / 'my_reward.py'}:missing",
        "--out",
        str(tmp_path / "bad"),
    )
    assert bad.returncode == 2 and "has no callable 'missing'" in bad.stderr


@pytest.mark.needs_trl_ppo
def test_trl_ppo_config_turns_checkpointing_off_without_a_deprecation_warning(tmp_path):
    import warnings

    from trl_ext.trl_compat.backend import trl_ppo_config

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*checkpointing.* is deprecated", category=FutureWarning)
        args = trl_ppo_config(doubling_ppo_config(), tmp_path)
    assert args.gradient_checkpointing is False  # TRL's PPOTrainer reads the old name


def test_the_settings_trl_ppo_cannot_express_are_named():
    """A comparison with TRL's PPO states where the rows differ: the options TRL's PPO fixes, when ours are set
    otherwise, and nothing at TRL's values (the import needs no TRL)."""
    from trl_ext.runs.runners import fixed_differences
    from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config

    assert fixed_differences("trl", doubling_ppo_config(score_position="after_last_token")) == {}
    differ = fixed_differences("trl", doubling_ppo_config(whiten_advantages=False, beta=0.1))
    assert differ == {
        "score_position": ("last_token", "after_last_token"),
        "whiten_advantages": (False, True),
        "beta": (0.1, 0.0),
    }
    # the estimator's own whitening counts where the config leaves it unset: GRPO's rows do not whiten
    grpo = doubling_ppo_config(advantage_estimator="grpo", kl_coef=0.0, skip_special_tokens=False)
    assert fixed_differences("grpo", grpo) == {"skip_special_tokens": (False, True)}
    assert fixed_differences("scratch", grpo) == {}
    # TRL's PPO whitens; a GRPO-estimator config left unset does not
    assert fixed_differences(
        "trl", doubling_ppo_config(advantage_estimator="grpo", score_position="after_last_token")
    ) == {
        "advantage_estimator": ("grpo", "gae"),
        "whiten_advantages": (False, True),
    }
