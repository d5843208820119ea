"""Turn-level credit (advantage_estimator 'turn_gae'): GAE over a multi-turn rollout's turns by hand, one advantage
per turn spread over its tokens, the critic read and trained at each turn's first token, and a run through the
trainer on a scripted two-turn environment."""

import pytest
import torch
from tool_models import ScriptedSampler, call_text, tiny_tool_model, tool_tokenizer

from trl_ext.agents import ToolResult
from trl_ext.ppo import turn_credit
from trl_ext.ppo.advantages import compute_advantages
from trl_ext.ppo.config import PPOConfig


def test_turn_starts_mark_each_run_of_model_tokens():
    loss_mask = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0], [0, 1, 0, 1, 0, 0, 0, 0]])
    assert turn_credit.turn_starts(loss_mask).tolist() == [[1, 0, 0, 0, 1, 0, 0, 0], [0, 1, 0, 1, 0, 0, 0, 0]]


def test_gae_over_turns_by_hand():
    """Two turns of 2 and 3 tokens (compacted), rewards 0.1 on the first turn's end and 1 on the second's, values
    0.5 and 0.8 at the turn starts, gamma 1, lambda 0.9: delta_1 = 1 - 0.8 = 0.2 = A_1; delta_0 = 0.1 + 0.8 - 0.5 =
    0.4, A_0 = 0.4 + 0.9 * 0.2 = 0.58. Values inside a turn are never read."""
    rewards = torch.tensor([[0.0, 0.1, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 9.0, 0.8, 9.0, 9.0, 0.0]])
    value_mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    starts = torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    advantages, returns = turn_credit.turn_gae_advantages(rewards, values, value_mask, starts, 1.0, 0.9)
    assert torch.allclose(advantages, torch.tensor([[0.58, 0.58, 0.2, 0.2, 0.2, 0.0]]))
    assert torch.allclose(returns, torch.tensor([[1.08, 1.08, 1.0, 1.0, 1.0, 0.0]]))


def test_one_turn_is_its_return_less_its_first_value_whatever_lambda():
    rewards = torch.tensor([[0.0, -0.1, 1.0, 0.0], [0.5, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.25, 3.0, 3.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    value_mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    starts = turn_credit.turn_starts(value_mask)
    for lam in (0.0, 0.95, 1.0):
        advantages, _ = turn_credit.turn_gae_advantages(rewards, values, value_mask, starts, 1.0, lam)
        assert torch.allclose(advantages, torch.tensor([[0.65, 0.65, 0.65, 0.0], [-0.5, 0.0, 0.0, 0.0]]))


def test_compute_advantages_credits_turns_around_the_environments_tokens():
    """A row of two model turns around tool tokens: each turn's tokens share one advantage, the tool's hold none,
    the turn reward counts for its turn, and the critic's mask is the two turn starts."""
    loss_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
    zeros = torch.zeros(1, 6)
    values = torch.tensor([[0.5, 7.0, 7.0, 7.0, 0.8, 7.0]])
    token_rewards = torch.tensor([[0.0, 0.1, 0.0, 0.0, 0.0, 0.0]])  # the first turn's reward on its last token
    cfg = PPOConfig(advantage_estimator="turn_gae", kl_coef=0.0, gamma=1.0, lam=0.9, whiten_advantages=False)
    out = compute_advantages(
        torch.tensor([1.0]), zeros, zeros, values, loss_mask, torch.tensor([True]), torch.tensor([0]), cfg,
        token_rewards=token_rewards,
    )  # fmt: skip
    assert torch.allclose(out.advantages, torch.tensor([[0.58, 0.58, 0.0, 0.0, 0.2, 0.2]]))
    assert out.value_mask.tolist() == [[1.0, 0.0, 0.0, 0.0, 1.0, 0.0]]
    assert torch.allclose(out.returns * out.value_mask, torch.tensor([[1.08, 0.0, 0.0, 0.0, 1.0, 0.0]]))
    token = compute_advantages(
        torch.tensor([1.0]), zeros, zeros, values, loss_mask, torch.tensor([True]), torch.tensor([0]),
        PPOConfig(kl_coef=0.0, gamma=1.0, lam=0.9, whiten_advantages=False), token_rewards=token_rewards,
    )  # fmt: skip
    assert not torch.allclose(token.advantages, out.advantages)  # the token-level critic reads every value


def test_turn_gae_takes_critic_lam_and_refuses_length_lambda():
    PPOConfig(advantage_estimator="turn_gae", critic_lam=1.0)
    with pytest.raises(Exception, match="lam_length_alpha is gae's setting"):
        PPOConfig(advantage_estimator="turn_gae", lam_length_alpha=0.05)


class Counter:
    """Two turns: a call to ``increment`` (a reward for the turn), then the answer."""

    def reset(self, **row):
        self.value = 0
        return " Start at 0."

    def increment(self, step: int) -> str:
        """Add to the counter.

        Args:
            step: How much to add.
        """
        self.value += step
        return ToolResult(f"now {self.value}", reward=0.1 * step)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_tool_model(tmp_path_factory.mktemp("tool-model"))


def test_a_turn_level_critic_trains_on_a_two_turn_environment(model_path):
    from datasets import Dataset

    from trl_ext.ppo import PPOTrainer

    config = PPOConfig(
        advantage_estimator="turn_gae",
        batch_size=4,
        total_episodes=4,
        response_length=300,
        learning_rate=1e-3,
        num_ppo_epochs=1,
        sampler="loop",
    )
    rows = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Count {i}."}] for i in range(4)]})
    trainer = PPOTrainer(
        str(model_path),
        reward_funcs=[lambda completions, **_: [float(len(c[-1]["content"])) for c in completions]],
        args=config,
        train_dataset=rows,
        processing_class=tool_tokenizer(),
        environment_factory=Counter,
    )
    trainer.sampler = ScriptedSampler(trainer.tokenizer, [call_text("increment", {"step": 2}), "done"])
    captured, update = {}, trainer._update

    def spy(exp, forward=None):
        captured["exp"] = exp
        return update(exp, forward)

    trainer._update = spy
    (stats,) = trainer.train()
    exp = captured["exp"]
    # the critic is read at the two turns' first tokens
    assert exp.outcome.value_mask.sum(-1).tolist() == [2.0] * 4
    starts = turn_credit.turn_starts(exp.mask)
    assert torch.equal(exp.outcome.value_mask, starts.to(exp.outcome.value_mask.dtype))
    # one advantage a turn: every model token of a turn holds its turn's
    for row in range(4):
        turn = turn_credit.turn_index(starts[row : row + 1], exp.mask[row : row + 1])[0]
        for k in (0, 1):
            assert exp.outcome.advantages[row][turn == k].unique().numel() == 1
    assert stats["turns/per_rollout"] == 2.0 and torch.isfinite(torch.tensor(stats["loss/value_avg"]))
