"""The pure step from scored rollouts to advantages and the policy loss: hand-sized tensors, no model."""

from types import SimpleNamespace

import pytest
import torch

from trl_ext.ppo import core, losses
from trl_ext.ppo.advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from trl_ext.ppo.config import PPOConfig
from trl_ext.settings.registry import Registry

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


@ADVANTAGE_ESTIMATORS.register("test_outcome")  # registered as a user would; the name is this module's own
def _outcome(batch, config):
    return batch.per_token(batch.sequence_returns()), None


def test_registry_decorator_duplicate_and_unknown_names():
    kinds = Registry("widget", needs_values=False)

    @kinds.register("a", needs_values=True)
    def a():
        return 1

    assert list(kinds) == ["a"] and kinds["a"].fn is a and kinds["a"].needs_values
    with pytest.raises(ValueError, match="^widget 'a' is already registered$"):
        kinds.register("a")
    with pytest.raises(ValueError, match="unknown widget 'b': known are a"):
        kinds["b"]
    with pytest.raises(TypeError, match="properties"):
        kinds.register("c", colour="red")
    assert {"gae", "grpo", "rloo", "reinforce_pp"} <= set(ADVANTAGE_ESTIMATORS)
    assert set(core.KL_ESTIMATORS) >= {"k1", "k2", "k3"} and set(losses.LOSS_AGGREGATIONS) == {
        "bnpo",
        "grpo",
        "dr_grpo",
    }


def test_registered_estimator_is_a_config_choice():
    assert PPOConfig(advantage_estimator="test_outcome").advantage_estimator == "test_outcome"
    with pytest.raises(
        ValueError, match="unknown advantage_estimator .nope.: known are gae, turn_gae, grpo, rloo, reinforce_pp"
    ):
        PPOConfig(advantage_estimator="nope")


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    assert torch.allclose(core.kl_estimate(logp, ref, "k2"), torch.tensor([[0.125, 0.5]]))
    r = torch.exp(ref - logp)
    assert torch.allclose(core.kl_estimate(logp, ref, "k3"), r - 1 - torch.log(r))


def test_group_statistics_grpo_and_rloo_by_hand():
    returns = torch.tensor([1.0, 3.0, 2.0, 2.0, 5.0])
    groups = torch.tensor([0, 0, 1, 1, 7])  # a group of one at the end
    group = core.group_normalised_scores(returns, groups, "group")
    assert torch.allclose(group, torch.tensor([-1 / (2**0.5 + 1e-4), 1 / (2**0.5 + 1e-4), 0.0, 0.0, 0.0]))
    assert torch.allclose(core.group_normalised_scores(returns, groups, "none"), torch.tensor([-1.0, 1, 0, 0, 0]))
    batch = core.group_normalised_scores(returns, groups, "batch")
    assert torch.allclose(batch, torch.tensor([-1.0, 1, 0, 0, 0]) / (returns.std() + 1e-4))
    rloo = core.leave_one_out_advantages(torch.tensor([1.0, 3.0, 8.0, 4.0]), torch.tensor([0, 0, 0, 1]))
    assert torch.allclose(rloo, torch.tensor([1 - 5.5, 3 - 4.5, 8 - 2.0, 0.0]))
    # rows of a group need not be adjacent
    assert torch.allclose(
        core.leave_one_out_advantages(torch.tensor([1.0, 8.0, 3.0]), torch.tensor([0, 1, 0])),
        torch.tensor([-2.0, 0.0, 2.0]),
    )


def test_discounted_returns_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert torch.allclose(core.discounted_returns(rewards, mask, 0.5), torch.tensor([[2.75, 3.5, 3.0, 0.0]]))


def _advantages(estimator, values=None, **overrides):
    cfg = PPOConfig(advantage_estimator=estimator, kl_coef=0.5, **overrides)
    logprobs = torch.tensor([[-1.0, -1.0, -1.0, 0.0], [-2.0, -1.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5, 0.0], [-2.0, -1.5, 0.0, 0.0]])
    return compute_advantages(
        torch.tensor([2.0, -1.0]), logprobs, ref, values, MASK, torch.tensor([True, False]), torch.tensor([0, 0]), cfg
    )


def test_compute_advantages_rules_by_hand():
    # k1 KL 0.5, 0, -0.5 and 0, 0.5: token rewards -0.25, 0, 0.25 (+2 on the last) and 0, -0.25 (-1 - 3 eos penalty)
    out = _advantages("test_outcome", missing_eos_penalty=3.0)
    assert torch.equal(out.scores, torch.tensor([2.0, -4.0]))
    assert torch.allclose(out.rewards, torch.tensor([[-0.25, 0.0, 2.25, 0.0], [0.0, -4.25, 0.0, 0.0]]))
    assert torch.allclose(out.advantages, torch.tensor([[2.0, 2, 2, 0], [-4.25, -4.25, 0, 0]]))
    assert out.returns is None and out.values is None
    # TRL 1.12's score position: one token past the last, inside the value mask
    after = _advantages("test_outcome", score_position="after_last_token")
    assert torch.equal(after.value_mask, torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]]))
    assert after.rewards[0, 3] == 2.0 and after.rewards[1, 2] == -1.0
    whitened = _advantages("test_outcome", whiten_advantages=True).advantages
    assert torch.allclose(
        whitened, core.masked_whiten(out.advantages + torch.tensor([[0.0], [3.0]]) * MASK, MASK) * MASK
    )


def test_critic_free_estimators_and_gae():
    grpo = _advantages("grpo").advantages  # returns 2 and -1.25, one group: centred +-1.625, std 3.25 / sqrt(2)
    expected = 1.625 / (3.25 / 2**0.5 + 1e-4)
    assert torch.allclose(grpo, torch.tensor([[1.0, 1, 1, 0], [-1.0, -1, 0, 0]]) * expected)
    assert torch.allclose(_advantages("rloo").advantages, torch.tensor([[3.25, 3.25, 3.25, 0], [-3.25, -3.25, 0, 0]]))
    reinforce = _advantages("reinforce_pp", whiten_advantages=False).advantages
    assert torch.allclose(reinforce, torch.tensor([[2.0, 2.25, 2.25, 0], [-1.25, -1.25, 0, 0]]))
    assert torch.allclose(_advantages("reinforce_pp").advantages, core.masked_whiten(reinforce, MASK) * MASK)
    values = torch.tensor([[0.5, 1.0, 2.0, 7.0], [0.0, 0.0, 7.0, 7.0]])
    gae = _advantages("gae", values=values, gamma=1.0, lam=1.0)
    assert torch.allclose(gae.returns, torch.tensor([[2.0, 2.25, 2.25, 0.0], [-1.25, -1.25, 0, 0]]))
    with pytest.raises(ValueError, match="^advantage_estimator 'gae' needs values, but there is no critic$"):
        _advantages("gae")


def test_loss_aggregations_and_sequence_clip_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 6.0, 99.0, 99.0]])
    assert losses.token_mean(per_token, MASK, 4).item() == pytest.approx(16 / 5)
    assert losses.sequence_mean(per_token, MASK, 4).item() == pytest.approx((2.0 + 5.0) / 2)
    assert losses.fixed_length_mean(per_token, MASK, 4).item() == pytest.approx(16 / 8)
    logp = torch.tensor([[-1.0, -1.0, -1.0, 5.0], [-1.0, -1.0, 5.0, 5.0]])
    old = logp - torch.tensor([[0.1, 0.1, 0.1, 9.0], [0.0, -0.05, 9.0, 9.0]])
    adv = torch.tensor([[2.0, 2.0, 2.0, 0.0], [-1.0, -1.0, 0.0, 0.0]])
    loss, stats = losses.sequence_clip_loss(logp, old, adv, MASK, 0.2)
    ratios = torch.exp(torch.tensor([0.3, -0.05]))
    expected = torch.stack([-2.0 * torch.clamp(ratios[0], 0.8, 1.2), 1.0 * ratios[1]])
    assert torch.allclose(loss[:, 0], expected) and torch.allclose(loss, expected[:, None].expand(2, 4))
    assert stats["clipfrac"].item() == 0.5


def test_policy_loss_adds_beta_times_k3():
    logp = torch.tensor([[-1.0, -2.0, -1.0, 0.0], [-1.0, -1.0, 0.0, 0.0]], requires_grad=True)
    ref, adv = logp.detach() - 0.3, torch.ones(2, 4)
    cfg = SimpleNamespace(
        policy_loss="clip",
        policy_loss_kwargs=None,
        cliprange_high=None,
        cliprange=0.2,
        beta=0.0,
        loss_type="grpo",
        response_length=4,
        kl_loss_estimator="k3",
        use_bias_correction_kl=True,
    )
    plain, _ = losses.policy_loss(logp, logp.detach(), ref, adv, MASK, cfg)
    with_kl, stats = losses.policy_loss(
        logp, logp.detach(), ref, adv, MASK, SimpleNamespace(**{**vars(cfg), "beta": 0.1})
    )
    k3 = torch.expm1(torch.tensor(-0.3)) + 0.3
    assert plain.item() == pytest.approx(-1.0) and with_kl.item() == pytest.approx(-1.0 + 0.1 * k3.item(), abs=1e-6)
    assert stats["kl_loss"].item() == pytest.approx(k3.item(), abs=1e-6)


def test_num_generations_must_divide_the_batch():
    with pytest.raises(ValueError, match="^batch_size 10 is not divisible by num_generations 4$"):
        PPOConfig(batch_size=10, num_generations=4, num_mini_batches=1)
