import math

import pytest
import torch
from safetensors.torch import load_file

from trl_ext.errors import InputError
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.trainer import PPOError, PPOTrainer
from trl_ext.rollouts import RolloutBatch
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config


@pytest.fixture()
def pieces(trained_artifacts):
    from trl_ext.tasks.doubling.artifacts import load_classifier, load_policy
    from trl_ext.tasks.doubling.rewards import doubling_classifier_reward

    policy, tok = load_policy(trained_artifacts["policy"])
    clf, clf_tok = load_classifier(trained_artifacts["reward"])
    return policy, tok, doubling_classifier_reward(clf, clf_tok)


def doubling_config(**options) -> PPOConfig:
    """The doubling classifier was trained on answers that end in E (the eos): keep it in completions."""
    return doubling_ppo_config(skip_special_tokens=False, **options)


def _params(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def _recording_scores(reward) -> list[list[float]]:
    """Each call's scores of the ``ClassifierReward`` ``reward``, from now on (its name and mode unchanged)."""
    calls, score = [], reward.score

    def recording(prompts, completions, **columns):
        calls.append(score(prompts, completions, **columns))
        return calls[-1]

    reward.score = recording
    return calls


def test_few_updates_move_weights_and_give_finite_metrics(pieces, tmp_path):
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    policy, tok, reward = pieces
    cfg = doubling_config(batch_size=16, num_mini_batches=2, total_episodes=32, num_ppo_epochs=2)
    trainer = PPOTrainer(
        policy, reward, args=cfg, train_dataset=ppo_prompt_dataset(tok, 32, seed=0), processing_class=tok
    )
    before, head_before = _params(trainer.policy), _params(trainer.actor_critic.value_head)
    scored = _recording_scores(reward)
    history = trainer.train()
    assert len(history) == 2 and trainer.episode == 32
    for stats, scores in zip(history, scored, strict=True):
        assert all(math.isfinite(v) for v in stats.values() if isinstance(v, float)), stats
        # each update trained on the reward's scores of its own 16 rollouts
        assert len(scores) == 16 and stats["objective/scores"] == pytest.approx(sum(scores) / 16, abs=1e-6)
        assert stats["rewards/charset_classifier/mean"] == pytest.approx(sum(scores) / 16, abs=1e-6)
    after = _params(trainer.policy)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert any(not torch.equal(head_before[n], p) for n, p in _params(trainer.actor_critic.value_head).items())
    # the reference policy stays frozen: the starting policy, bit for bit, after two updates
    assert all(not p.requires_grad for p in trainer.ref_policy.parameters())
    assert all(torch.equal(before[n], p) for n, p in trainer.ref_policy.named_parameters())
    path = trainer.save(tmp_path / "out")
    from transformers import AutoModelForCausalLM

    again = AutoModelForCausalLM.from_pretrained(path)
    assert torch.equal(again.transformer.wte.weight, trainer.policy.transformer.wte.weight)
    assert (path / "value_head.safetensors").exists()


def test_step_wise_api(pieces):
    policy, tok, reward = pieces
    trainer = PPOTrainer(policy, args=doubling_ppo_config(batch_size=4, num_ppo_epochs=1), processing_class=tok)
    queries = [tok("S数字:3320x2=", add_special_tokens=False)["input_ids"]] * 2 + [
        tok("S大写:10x2=", add_special_tokens=False)["input_ids"]
    ] * 2
    responses = trainer.generate(queries)
    assert len(responses) == 4 and all(0 < len(r) <= 8 for r in responses)
    assert all(tok.eos_token_id not in r[:-1] for r in responses)  # cut after the first eos
    texts = tok.batch_decode(responses)
    scores = reward([tok.decode(q) for q in queries], texts)
    before = _params(trainer.policy)
    stats = trainer.step(queries, responses, scores)
    assert stats["update"] == 1 and math.isfinite(stats["loss/policy_avg"])
    # the update is on these rollouts and scores
    assert stats["objective/scores"] == pytest.approx(sum(scores) / 4, abs=1e-6)
    assert stats["val/response_length"] == pytest.approx(sum(map(len, responses)) / 4)
    assert any(not torch.equal(before[n], p) for n, p in trainer.policy.named_parameters())
    with pytest.raises(InputError, match="as many queries, responses and scores"):
        trainer.step(queries, responses, scores[:2])
    with pytest.raises(InputError, match="non-finite score at index 1"):
        trainer.step(queries, responses, [0.0, float("nan"), 0.0, 0.0])


def test_missing_eos_penalty_lowers_only_unfinished_scores(pieces):
    policy, tok, _ = pieces
    trainer = PPOTrainer(
        policy, args=doubling_ppo_config(batch_size=2, num_ppo_epochs=1, missing_eos_penalty=1.5), processing_class=tok
    )
    queries = [tok("S数字:12x2=", add_special_tokens=False)["input_ids"]] * 2
    finished, cut = (
        tok("24E", add_special_tokens=False)["input_ids"],
        tok("2444", add_special_tokens=False)["input_ids"],
    )
    query_ids, query_mask = trainer.sampling.pad(queries)
    responses = torch.tensor([finished + [tok.pad_token_id], cut])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    batch = RolloutBatch(
        query_ids,
        query_mask,
        responses,
        loss_mask=mask,
        attention_mask=mask,
        prompts=queries,
        completions=["24E", "2444"],
        completion_ids=[finished, cut],
    )
    experience, _ = trainer._experience(batch, torch.tensor([1.0, 1.0]))
    assert experience.outcome.scores.tolist() == [1.0, -0.5]
    with pytest.raises(ValueError, match="missing_eos_penalty must not be negative"):
        PPOConfig(missing_eos_penalty=-1.0)


def test_non_finite_loss_stops_and_keeps_last_good(pieces, tmp_path, monkeypatch):
    from trl_ext.ppo import core
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    policy, tok, reward = pieces
    real = core.clipped_value_loss
    calls = {"n": 0}

    def sometimes_nan(*args, **kwargs):
        calls["n"] += 1
        loss, stats = real(*args, **kwargs)
        return (loss * float("nan"), stats) if calls["n"] > 1 else (loss, stats)

    monkeypatch.setattr(core, "clipped_value_loss", sometimes_nan)
    cfg = doubling_config(batch_size=8, num_ppo_epochs=1, total_episodes=32, output_dir=str(tmp_path))
    trainer = PPOTrainer(
        policy, reward, args=cfg, train_dataset=ppo_prompt_dataset(tok, 32, seed=0), processing_class=tok
    )
    start, after_update_1 = _params(trainer.policy), {}
    head = trainer.actor_critic.value_head
    keep = lambda update, stats: after_update_1.update(policy=_params(trainer.policy), head=_params(head))  # noqa: E731
    with pytest.raises(PPOError, match="non-finite loss .* update 2.*last good policy is saved"):
        trainer.train(on_update=keep)
    from transformers import AutoModelForCausalLM

    # the last good policy is the one update 1 left, bit for bit (not the start, not a half-applied update 2)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "last_good")
    assert all(torch.equal(after_update_1["policy"][n], p) for n, p in saved.named_parameters())
    assert any(not torch.equal(start[n], p) for n, p in saved.named_parameters())
    saved_head = load_file(tmp_path / "last_good" / "value_head.safetensors")
    assert saved_head.keys() == after_update_1["head"].keys()
    assert all(torch.equal(after_update_1["head"][n], t) for n, t in saved_head.items())


def test_bad_setup_errors(pieces):
    policy, tok, reward = pieces
    with pytest.raises(ValueError, match="not divisible by num_mini_batches"):
        PPOConfig(batch_size=10, num_mini_batches=4)
    import copy

    no_eos = copy.deepcopy(tok)
    no_eos.eos_token = None
    with pytest.raises(InputError, match="no eos"):
        PPOTrainer(policy, reward, processing_class=no_eos)
    with pytest.raises(InputError, match="reward_weights has 2 values for 1 reward functions"):
        PPOTrainer(policy, reward, args=PPOConfig(reward_weights=[1.0, 2.0]), processing_class=tok)
    with pytest.raises(InputError, match="reward_funcs holds a int"):
        PPOTrainer(policy, [reward, 3], processing_class=tok)


def test_learning_raises_requested_charset_rate(pieces):
    """A small budget (60 updates of 64, at the demo's short-run rate) must clearly lift the requested-charset rate
    (an Intel Xeon: 0.34 -> 0.58 at 40 updates, just under the bar; at 60: 0.34 -> 1.00)."""
    from trl_ext.tasks.doubling.evaluate import evaluate_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    policy, tok, reward = pieces
    before = evaluate_policy(policy, tok, n=200, sample=False)["greedy"]["charset_acc"]
    cfg = doubling_config(batch_size=64, total_episodes=64 * 60, learning_rate=1e-3, seed=1, separate_critic=True)
    trainer = PPOTrainer(
        policy,
        reward,
        args=cfg,
        train_dataset=ppo_prompt_dataset(tok, cfg.total_episodes, seed=1),
        processing_class=tok,
    )
    trainer.train()
    after = evaluate_policy(trainer.policy, tok, n=200, sample=False)["greedy"]["charset_acc"]
    assert after >= before + 0.25, (before, after)


def test_bad_reward_output_inside_training_is_named(pieces):
    from trl_ext.rewards import RewardError
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    policy, tok, _ = pieces

    def half_nan(prompts, completions, **columns):
        return [float("nan") if i == 3 else 1.0 for i in range(len(prompts))]

    trainer = PPOTrainer(
        policy,
        half_nan,
        args=doubling_ppo_config(batch_size=8, total_episodes=8),
        train_dataset=ppo_prompt_dataset(tok, 8, seed=0),
        processing_class=tok,
    )
    with pytest.raises(RewardError, match="'half_nan' returned nan at index 3"):
        trainer.train()


@pytest.mark.needs_trl_ppo
def test_trainer_scores_equal_trl_get_reward_on_same_tokens(pieces):
    """The reward the scratch trainer computes for its rollouts is the number TRL's get_reward
    gets through as_ppo_reward_model for the same token ids."""
    from trl.experimental.utils import get_reward

    from trl_ext.data.batching import pad_batch
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset
    from trl_ext.trl_compat.reward_model import as_ppo_reward_model

    policy, tok, reward = pieces
    seen = {}

    def recording(prompts, completions, **columns):
        seen.update(prompts=prompts, completions=completions, scores=reward(prompts, completions, **columns))
        return seen["scores"]

    recording.__name__ = "recording"
    data = ppo_prompt_dataset(tok, 16, seed=3)
    PPOTrainer(
        policy,
        recording,
        args=doubling_config(batch_size=16, total_episodes=16),
        train_dataset=data,
        processing_class=tok,
    ).train()
    queries, _ = pad_batch(tok(seen["prompts"], add_special_tokens=False)["input_ids"], tok.pad_token_id, "left")
    responses, _ = pad_batch(tok(seen["completions"], add_special_tokens=False)["input_ids"], tok.pad_token_id)
    module = as_ppo_reward_model(reward, tok, data, skip_special_tokens=False)  # as the trainer above decodes
    _, via_trl, _ = get_reward(module, torch.cat([queries, responses], 1), tok.pad_token_id, queries.shape[1])
    assert via_trl.tolist() == pytest.approx(seen["scores"], abs=1e-5)


def test_in_house_trainer_does_not_need_trl_ppo():
    """TRL >= 1.13 has no trl.experimental.ppo: the scratch trainer must not import it."""
    import subprocess
    import sys

    code = (
        "import sys; import trl_ext.ppo, trl_ext.rewards, trl_ext.commands.ppo; "
        "assert 'trl.experimental.ppo' not in sys.modules, 'imported'"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_step_masks_padding_of_responses_without_eos(pieces):
    policy, tok, _ = pieces
    trainer = PPOTrainer(policy, args=doubling_ppo_config(batch_size=2, num_ppo_epochs=1), processing_class=tok)
    query = tok("S数字:3320x2=", add_special_tokens=False)["input_ids"]
    six, six_six, zero = tok.convert_tokens_to_ids(["6", "6", "0"])
    stats = trainer.step([query, query], [[six, six], [six, six_six, zero, tok.eos_token_id, six]], [1.0, 0.0])
    # lengths 2 (no eos: its own length) and 4 (up to and including the first eos)
    assert stats["val/response_length"] == pytest.approx(3.0)


def test_bad_loss_on_one_rank_stops_every_rank(tmp_path):
    """With 2 processes, a NaN loss on rank 0 alone must stop both ranks (it used to hang in save's barrier)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    from launch import accelerate_port_args

    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *accelerate_port_args(),
        "--config_file",
        str(root / "recipes/accelerate/multi_cpu.yaml"),
        str(root / "tests/scripts/bad_loss_two_ranks.py"),
        str(tmp_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=root)
    out = run.stdout + run.stderr
    assert "rank 0 of 2: non-finite loss" in out and "rank 1 of 2: non-finite loss" in out, out[-3000:]
    assert "update 2, epoch 1, minibatch 1" in out and (tmp_path / "last_good" / "model.safetensors").exists()


def test_reward_model_moves_to_the_trainer_device_and_value_head_is_read_back(pieces, tmp_path):
    from trl_ext.rewards import RewardFunction

    policy, tok, reward = pieces

    class Placed(RewardFunction):
        device = None

        def to(self, device):
            self.device = device
            return self

        def score(self, prompts, completions, **columns):
            return [0.0] * len(prompts)

    placed = Placed()
    trainer = PPOTrainer(policy, placed, args=doubling_config(batch_size=4, num_ppo_epochs=1), processing_class=tok)
    assert placed.device == trainer.accelerator.device
    with torch.no_grad():
        trainer.actor_critic.value_head.weight.fill_(0.25)
    saved = trainer.save(tmp_path / "ppo")
    again = PPOTrainer(str(saved), placed, args=doubling_config(batch_size=4))
    assert torch.equal(again.actor_critic.value_head.weight, trainer.actor_critic.value_head.weight)


def test_a_registered_advantage_estimator_drives_the_trainer(tokenizer):
    """The extension point: a function registered in ADVANTAGE_ESTIMATORS is a config choice the trainer calls."""
    from trl_ext.ppo.advantages import ADVANTAGE_ESTIMATORS
    from trl_ext.tasks.doubling.models import build_policy

    calls = []

    @ADVANTAGE_ESTIMATORS.register("trainer_test_outcome")  # a name of this test's own: registered once
    def outcome_only(batch, config):  # every token gets the sequence's total reward
        calls.append(batch.rewards.shape)
        return batch.per_token(batch.sequence_returns()), None

    trainer = PPOTrainer(
        build_policy(tokenizer),
        args=doubling_ppo_config(
            batch_size=2, num_ppo_epochs=1, kl_mode="sequence", advantage_estimator="trainer_test_outcome"
        ),
        processing_class=tokenizer,
    )
    assert trainer.actor_critic.value_head is None  # critic-free: no value head, no value loss
    query = tokenizer("S数字:3320x2=", add_special_tokens=False)["input_ids"]
    stats = trainer.step([query, query], trainer.generate([query, query]), [1.0, 0.0])
    assert len(calls) == 1 and math.isfinite(stats["loss/policy_avg"]) and "loss/value_avg" not in stats


def test_experience_minibatch_takes_the_same_rows_of_every_field():
    from dataclasses import fields

    from trl_ext.ppo.advantages import Advantages
    from trl_ext.ppo.experience import Experience

    def filled(cls, start):
        return cls(**{f.name: torch.arange(12.0).reshape(4, 3) + start + i for i, f in enumerate(fields(cls))})

    exp = filled(Experience, 0)
    exp.outcome = filled(Advantages, 100)
    mb = exp.minibatch(torch.tensor([2, 0]))
    assert len(mb) == 2
    for record, rows in ((exp, mb), (exp.outcome, mb.outcome)):
        for f in fields(record):
            if f.name != "outcome":
                assert torch.equal(getattr(rows, f.name), getattr(record, f.name)[[2, 0]]), f.name
