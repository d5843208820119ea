"""The critic trained as the field trains it, and its health measured: the metrics by hand, the critic's own
learning rate as a parameter group, the critic's own epochs, the value loss without its clip."""

import math

import pytest
import torch

from trl_ext.errors import InputError
from trl_ext.ppo import core, critic_health
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.critic_health import CriticHealth
from trl_ext.ppo.trainer import PPOTrainer


def test_first_token_reads_each_rows_first_masked_position():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])  # the second row starts after a tool result
    assert torch.equal(critic_health.first_token(values, mask), torch.tensor([1.0, 5.0]))


def test_correlation_by_hand_and_zero_where_a_side_is_constant():
    x, y = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 7.0])
    # centred: (-1, 0, 1) and (-2.333, -0.333, 2.667): 5 / sqrt(2 * 12.667)
    assert critic_health.correlation(x, y).item() == pytest.approx(5 / math.sqrt(2 * 38 / 3), abs=1e-6)
    assert critic_health.correlation(x, -y).item() == pytest.approx(-5 / math.sqrt(2 * 38 / 3), abs=1e-6)
    assert critic_health.correlation(torch.zeros(3), y).item() == 0.0  # a zero-initialised head's values


def test_pooled_explained_variance_survives_a_batch_of_near_constant_returns():
    """One batch whose returns are nearly equal sends its own explained variance far below zero; the window of
    updates pooled with it does not swing: the critic is as good as it was."""
    health, ones = CriticHealth(window=2), torch.ones(1, 4)
    first = health.observe(torch.tensor([[0.1, 0.9, 0.2, 0.8]]), torch.tensor([[0.0, 1.0, 0.0, 1.0]]), ones)
    assert first["val/explained_variance_pooled"] == first["val/explained_variance"]  # a window of one
    second = health.observe(torch.tensor([[0.9, 0.8, 0.9, 0.95]]), torch.tensor([[1.0, 1.0, 1.0, 1.001]]), ones)
    assert second["val/explained_variance"] < -100 and second["val/returns_var"] < 1e-5
    pooled = core.explained_variance(
        torch.tensor([[0.1, 0.9, 0.2, 0.8, 0.9, 0.8, 0.9, 0.95]]),
        torch.tensor([[0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.001]]),
        torch.ones(1, 8),
    )
    assert second["val/explained_variance_pooled"] == pytest.approx(pooled.item()) and pooled > 0.5
    health.observe(torch.zeros(1, 4), torch.tensor([[0.0, 1.0, 2.0, 3.0]]), ones)
    assert len(health.window) == 2  # the oldest batch left the window


def test_value_loss_without_its_clip_is_half_the_squared_error():
    values, old = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 0.0]])
    returns, mask = torch.tensor([[0.5, 1.0]]), torch.ones(1, 2)
    plain, stats = core.clipped_value_loss(values, old, returns, mask, None)
    assert plain.item() == pytest.approx(0.5 * (1.5**2 + 1.0) / 2) and stats["clipfrac"].item() == 0.0
    clipped, _ = core.clipped_value_loss(values, old, returns, mask, 0.2)  # V=2 clipped to 0.2: (0.3)^2 < 1.5^2
    assert clipped.item() == pytest.approx(0.5 * (1.5**2 + 1.0) / 2)  # max() keeps the larger error there
    far, _ = core.clipped_value_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([[2.0, 2.0]]), returns, mask, 0.2)
    unclipped_far, _ = core.clipped_value_loss(
        torch.tensor([[0.0, 0.0]]), torch.tensor([[2.0, 2.0]]), returns, mask, None
    )
    assert far.item() > unclipped_far.item()  # clipped at 1.8, the error is larger than V=0's own


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(critic_learning_rate=0.0), "critic_learning_rate must be positive"),
        (dict(num_ppo_epochs=4, num_critic_epochs=2), "num_critic_epochs \\(2\\) must be at least num_ppo_epochs"),
    ],
)
def test_bad_critic_settings_are_one_input_error(options, message):
    with pytest.raises(InputError, match=message):
        PPOConfig(**options)


def test_critic_options_are_inert_without_a_critic():
    config = PPOConfig(advantage_estimator="grpo", num_generations=2)
    assert set(config.inert_options(["critic_learning_rate", "num_critic_epochs"])) == {
        "critic_learning_rate",
        "num_critic_epochs",
    }


def _length(completions, **_):
    return [float(len(c)) for c in completions]


class StepRecorder(PPOTrainer):
    """Each optimizer step's weights of the policy and of the value head, after the step."""

    def _optimizer_step(self):
        super()._optimizer_step()
        self.steps.append(
            (
                [p.detach().clone() for p in self.policy.parameters()],
                [p.detach().clone() for p in self.actor_critic.value_head.parameters()],
            )
        )


def _trainer(tokenizer, cls=PPOTrainer, **options):
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    base = dict(
        batch_size=4,
        num_ppo_epochs=1,
        num_mini_batches=1,
        total_episodes=4,
        response_length=5,
        learning_rate=1e-3,
        temperature=1.0,
        lr_scheduler_type="constant",
    )
    config = PPOConfig(**{**base, **options})
    trainer = cls(
        build_policy(tokenizer),
        _length,
        args=config,
        train_dataset=ppo_prompt_dataset(tokenizer, 4 * config.total_episodes, seed=0),
        processing_class=tokenizer,
    )
    trainer.steps = []
    return trainer


def _largest_change(before, after) -> float:
    return max((a - b).abs().max().item() for a, b in zip(after, before))


def test_critic_learning_rate_steps_the_value_head_at_its_own_rate(tokenizer):
    """Adam's first step moves every weight with a gradient by its learning rate (m / sqrt(v) = sign(g)): the
    value head by critic_learning_rate, the policy by learning_rate."""
    torch.manual_seed(0)
    trainer = _trainer(tokenizer, StepRecorder, critic_learning_rate=3e-2)
    groups = trainer.optimizer.param_groups
    assert [g["lr"] for g in groups] == [1e-3, 3e-2]
    head = {id(p) for p in trainer.actor_critic.value_head.parameters()}
    assert {id(p) for p in groups[1]["params"]} == head
    policy_before = [p.detach().clone() for p in trainer.policy.parameters()]
    head_before = [p.detach().clone() for p in trainer.actor_critic.value_head.parameters()]
    trainer.train()
    ((policy_after, head_after),) = trainer.steps
    assert _largest_change(head_before, head_after) == pytest.approx(3e-2, rel=1e-3)
    assert _largest_change(policy_before, policy_after) == pytest.approx(1e-3, rel=1e-3)


def test_critic_learning_rate_covers_a_separate_critics_backbone(tokenizer):
    trainer = _trainer(tokenizer, separate_critic=True, critic_learning_rate=3e-2)
    critic = {id(p) for p in trainer.actor_critic.critic_parameters()}
    backbone = {id(p) for p in trainer.actor_critic.critic_backbone.parameters()}
    assert backbone < critic and {id(p) for p in trainer.optimizer.param_groups[1]["params"]} == critic
    assert not critic & {id(p) for p in trainer.optimizer.param_groups[0]["params"]}


@pytest.mark.parametrize("separate_critic", [False, True])
def test_critic_epochs_beyond_ppos_train_the_critic_alone(tokenizer, separate_critic):
    """num_ppo_epochs 1 and num_critic_epochs 3, two minibatches: 6 optimizer steps an update; the policy moves in
    the first two, the value head in all six; the policy's stats average its own steps."""
    trainer = _trainer(
        tokenizer,
        StepRecorder,
        num_mini_batches=2,
        num_critic_epochs=3,
        separate_critic=separate_critic,
        critic_learning_rate=1e-2,
    )
    start = (
        [p.detach().clone() for p in trainer.policy.parameters()],
        [p.detach().clone() for p in trainer.actor_critic.value_head.parameters()],
    )
    (stats,) = trainer.train()
    assert len(trainer.steps) == 6
    policies = [start[0]] + [s[0] for s in trainer.steps]
    heads = [start[1]] + [s[1] for s in trainer.steps]
    policy_moved = [_largest_change(a, b) > 0 for a, b in zip(policies, policies[1:])]
    head_moved = [_largest_change(a, b) > 0 for a, b in zip(heads, heads[1:])]
    assert policy_moved == [True, True, False, False, False, False] and all(head_moved)
    assert math.isfinite(stats["loss/value_avg"]) and math.isfinite(stats["policy/clipfrac_avg"])


def test_every_update_logs_the_critics_health(tokenizer):
    history = _trainer(tokenizer, total_episodes=12).train()
    names = ("val/explained_variance_pooled", "val/returns_var", "val/first_value_return_corr", "loss/value_avg")
    assert all(math.isfinite(h[name]) for h in history for name in names)
    # one process: the first update's window holds its batch alone
    assert history[0]["val/explained_variance_pooled"] == pytest.approx(history[0]["val/explained_variance"])
    assert history[0]["val/returns_var"] > 0  # lengths differ at temperature 1: the returns do too
