"""The two masks of a multi-turn rollout, in the math: advantages, KL and losses over the model's own tokens only;
the environment's tokens are context. A change at a tool token changes no loss; advantages there are zero; GAE
bootstraps a value before a tool result from the model's next token; with no tool tokens nothing changes."""

import pytest
import torch

from trl_ext.ppo import core, losses, model_tokens
from trl_ext.ppo.advantages import _contiguous_advantages, compute_advantages
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config

# two rollouts: model turn, tool result, model turn (row 0); model turn, tool result, padding (row 1)
MODEL_MASK = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0, 0]])
TOOL = torch.tensor([[0, 0, 0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)


def _batch(seed=0, rows=2, width=8):
    g = torch.Generator().manual_seed(seed)
    return dict(
        scores=torch.randn(rows, generator=g),
        logprobs=-torch.rand(rows, width, generator=g),
        ref_logprobs=-torch.rand(rows, width, generator=g),
        values=torch.randn(rows, width, generator=g),
    )


def _config(**options):
    return doubling_ppo_config(**{**dict(num_generations=1, batch_size=2, kl_coef=0.1, gamma=0.9, lam=0.8), **options})


def _outcome(batch, config, turn_rewards=None):
    return compute_advantages(
        batch["scores"],
        batch["logprobs"],
        batch["ref_logprobs"],
        batch["values"],
        MODEL_MASK,
        torch.tensor([True, False]),
        torch.zeros(2, dtype=torch.long),
        config,
        token_rewards=turn_rewards,
    )


def test_compact_and_expand_are_inverse_on_model_tokens():
    values = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    index, compact_mask = model_tokens.model_token_order(MODEL_MASK)
    compact = model_tokens.compact_tokens(values, index, compact_mask)
    assert compact[0].tolist() == [0, 1, 2, 5, 6, 0, 0, 0]
    assert compact[1].tolist() == [8, 9, 0, 0, 0, 0, 0, 0]
    assert torch.equal(model_tokens.expand_tokens(compact, index, compact_mask), values * MODEL_MASK)


def test_gae_bootstraps_over_the_tool_result_from_the_models_next_token():
    batch, config = _batch(), _config(advantage_estimator="gae", whiten_advantages=False, kl_coef=0.0)
    outcome = _outcome(batch, config)
    # by hand, row 0: model tokens at 0, 1, 2, 5, 6; the value at 2 bootstraps from the value at 5
    v, steps = batch["values"][0], [0, 1, 2, 5, 6]
    rewards = {6: batch["scores"][0].item()}
    expected, running = {}, 0.0
    for k in reversed(range(len(steps))):
        t = steps[k]
        next_value = v[steps[k + 1]].item() if k + 1 < len(steps) else 0.0
        delta = rewards.get(t, 0.0) + config.gamma * next_value - v[t].item()
        running = delta + config.gamma * config.lam * running
        expected[t] = running
    for t, advantage in expected.items():
        assert outcome.advantages[0, t].item() == pytest.approx(advantage, abs=1e-6)
    assert outcome.returns[0, 2].item() == pytest.approx(expected[2] + v[2].item(), abs=1e-6)


@pytest.mark.parametrize("estimator", ["gae", "grpo", "rloo", "reinforce_pp"])
def test_tool_tokens_carry_no_advantage_kl_reward_or_value(estimator):
    config = _config(advantage_estimator=estimator, num_generations=2)
    outcome = _outcome(_batch(), config)
    off = MODEL_MASK == 0
    for name in ("advantages", "kl", "rewards", "non_score_rewards", "value_mask"):
        assert getattr(outcome, name)[off].abs().max() == 0, name
    if outcome.returns is not None:
        assert outcome.returns[off].abs().max() == 0
        assert outcome.values[off].abs().max() == 0
    assert outcome.advantages[MODEL_MASK.bool()].abs().max() > 0


@pytest.mark.parametrize("estimator", ["gae", "grpo", "rloo", "reinforce_pp"])
def test_a_tool_tokens_logprob_or_value_changes_no_loss(estimator):
    config = _config(advantage_estimator=estimator, num_generations=2, beta=0.1, ent_coef=0.0)
    batch = _batch()
    changed = {k: v.clone() for k, v in batch.items()}
    for name in ("logprobs", "ref_logprobs", "values"):
        changed[name][TOOL] += 3.0
    first, second = _outcome(batch, config), _outcome(changed, config)
    for name in ("advantages", "returns", "rewards", "kl"):
        if getattr(first, name) is not None:
            assert torch.equal(getattr(first, name), getattr(second, name)), name
    new_logprobs = batch["logprobs"] + 0.05
    changed_new = new_logprobs.clone()
    changed_new[TOOL] -= 2.0  # the update's own log-probs at a tool token do not count either
    for loss_type in ("bnpo", "grpo", "dr_grpo"):
        config.loss_type = loss_type
        one, _ = losses.policy_loss(
            new_logprobs, batch["logprobs"], batch["ref_logprobs"], first.advantages, MODEL_MASK, config
        )
        two, _ = losses.policy_loss(
            changed_new, changed["logprobs"], changed["ref_logprobs"], second.advantages, MODEL_MASK, config
        )
        assert one.item() == pytest.approx(two.item(), abs=0), loss_type
    if first.returns is not None:
        new_values = batch["values"] + 0.3
        changed_values = new_values.clone()
        changed_values[TOOL] += 5.0
        one, _ = core.clipped_value_loss(new_values, first.values, first.returns, first.value_mask, 0.2)
        two, _ = core.clipped_value_loss(changed_values, second.values, second.returns, second.value_mask, 0.2)
        assert one.item() == two.item()


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate", "sequence_mask"])
def test_importance_weights_and_entropy_read_the_models_tokens_only(mode):
    batch, config = _batch(), _config(advantage_estimator="grpo", num_generations=2, ent_coef=0.01)
    sampling = batch["logprobs"] - 0.1
    changed = sampling.clone()
    changed[TOOL] = -float("inf")  # what an engine may report for tokens it did not sample
    one = core.importance_sampling_weights(batch["logprobs"], sampling, MODEL_MASK, mode)
    two = core.importance_sampling_weights(batch["logprobs"], changed, MODEL_MASK, mode)
    assert torch.isfinite(two).all() and torch.equal(
        one * MODEL_MASK if one.shape[1] > 1 else one, two * MODEL_MASK if two.shape[1] > 1 else two
    )
    advantages = _outcome(batch, config).advantages
    losses_ = [
        losses.policy_loss(
            batch["logprobs"] + 0.05, batch["logprobs"], batch["ref_logprobs"], advantages, MODEL_MASK, config, w
        )[0]
        for w in (one, two)
    ]
    assert losses_[0].item() == losses_[1].item()
    entropy = torch.rand(2, 8)
    louder = entropy.clone()
    louder[TOOL] += 4.0
    assert core.masked_mean(entropy, MODEL_MASK) == core.masked_mean(louder, MODEL_MASK)


def test_per_turn_reward_lands_on_the_turns_last_token():
    config = _config(advantage_estimator="gae", whiten_advantages=False, kl_coef=0.0)
    turn_rewards = torch.zeros(2, 8)
    turn_rewards[0, 2] = 0.7  # the last token of row 0's first turn, before the tool result
    outcome = _outcome(_batch(), config, turn_rewards)
    base = _outcome(_batch(), config)
    assert outcome.rewards[0, 2].item() == pytest.approx(0.7)
    assert (outcome.rewards - base.rewards).abs().sum().item() == pytest.approx(0.7)
    # a critic-free estimator sums it into the row's return
    grpo = _config(advantage_estimator="grpo", num_generations=2, kl_coef=0.0, scale_rewards="none")
    with_turn, without = _outcome(_batch(), grpo, turn_rewards), _outcome(_batch(), grpo)
    assert (with_turn.advantages[0, 0] - without.advantages[0, 0]).item() == pytest.approx(0.35, abs=1e-6)


@pytest.mark.parametrize("estimator", ["gae", "grpo", "rloo", "reinforce_pp"])
def test_without_tool_tokens_the_advantages_are_the_rules_own(estimator):
    """A single-turn loss mask (no holes): compaction is the identity, the rules run on the rows as they are."""
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]])
    batch, config = _batch(3), _config(advantage_estimator=estimator, num_generations=2)
    ended = torch.tensor([True, False])
    today = _contiguous_advantages(
        batch["scores"],
        batch["logprobs"],
        batch["ref_logprobs"],
        batch["values"],
        mask,
        mask,
        ended,
        torch.zeros(2, dtype=torch.long),
        config,
        None,
        None,
    )
    masked = compute_advantages(
        batch["scores"],
        batch["logprobs"],
        batch["ref_logprobs"],
        batch["values"],
        mask,
        ended,
        torch.zeros(2, dtype=torch.long),
        config,
    )
    for name in ("advantages", "returns", "values", "kl", "rewards", "non_score_rewards"):
        a, b = getattr(today, name), getattr(masked, name)
        if a is not None:
            assert torch.allclose(a * mask, b, atol=1e-6), name


def test_ends_with_reads_the_last_model_token():
    tokens = torch.tensor([[5, 9, 7, 7, 5, 3], [5, 9, 7, 7, 9, 0]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 0]])
    assert core.ends_with(tokens, mask, 9).tolist() == [False, True]
    assert core.ends_with(tokens, torch.zeros_like(mask), 5).tolist() == [False, False]
