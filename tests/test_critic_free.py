"""Critic-free training in the scratch trainer: groups of completions per prompt, no value head."""

import math

import pytest
import torch

from trl_ext.ppo.trainer import PPOTrainer
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config


def test_grpo_trains_groups_without_a_critic(tokenizer):
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    seen = []

    def length_reward(prompts, completions, **_):  # any signal that varies within a group
        seen.append(list(prompts))
        return [float(len(c)) for c in completions]

    cfg = doubling_ppo_config(
        advantage_estimator="grpo",
        num_generations=2,
        batch_size=4,
        num_ppo_epochs=1,
        total_episodes=8,
        beta=0.1,
        loss_type="grpo",
        separate_critic=True,
        response_length=6,
    )
    trainer = PPOTrainer(
        build_policy(tokenizer),
        length_reward,
        args=cfg,
        train_dataset=ppo_prompt_dataset(tokenizer, 8, seed=0),
        processing_class=tokenizer,
    )
    assert trainer.actor_critic.value_head is None and trainer.actor_critic.critic_backbone is None
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    advantages, update = [], trainer._update
    trainer._update = lambda exp, forward=None: advantages.append(exp.outcome.advantages[:, 0]) or update(exp, forward)
    history = trainer.train()
    assert len(advantages) == 2 and any(a.abs().max() > 0.1 for a in advantages)
    for a in advantages:  # normalised within each prompt's pair (not over the batch): each pair sums to 0
        assert a[0] + a[1] == pytest.approx(0, abs=1e-6) and a[2] + a[3] == pytest.approx(0, abs=1e-6)
    assert len(history) == 2 and [len(batch) for batch in seen] == [4, 4]
    for batch in seen:  # two prompts a batch, each sampled twice in a row
        assert batch[0] == batch[1] and batch[2] == batch[3] and batch[0] != batch[2]
    assert seen[0][0] != seen[1][0]  # the next batch reads the next prompts
    stats = history[-1]
    assert "loss/value_avg" not in stats and math.isfinite(stats["loss/kl_avg"])
    assert trainer.episode == 8
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))
