import pytest
import torch

from trl_ext.ppo import core


def live_policy_loss(logprobs, old_logprobs, advantages, mask, cliprange):
    """The policy loss the trainer runs: PPO's per-token clip, averaged over unmasked tokens, no KL term."""
    from types import SimpleNamespace

    from trl_ext.ppo import losses

    cfg = SimpleNamespace(
        policy_loss="clip",
        policy_loss_kwargs=None,
        cliprange_high=None,
        loss_type="bnpo",
        beta=0.0,
        cliprange=cliprange,
        response_length=logprobs.shape[1],
    )
    return losses.policy_loss(logprobs, old_logprobs, old_logprobs, advantages, mask, cfg)


def _mask():
    return torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float32)


def test_logprobs_and_entropy_match_log_softmax():
    torch.manual_seed(0)
    logits, tokens = torch.randn(2, 3, 5), torch.randint(0, 5, (2, 3))
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    assert torch.allclose(core.logprobs_from_logits(logits, tokens), expected, atol=1e-6)
    uniform = torch.zeros(1, 1, 4)
    assert core.entropy_from_logits(uniform).item() == pytest.approx(torch.log(torch.tensor(4.0)).item())


@pytest.mark.needs_trl_ppo
def test_masked_stats_by_hand_and_against_trl():
    from trl.experimental.ppo.ppo_trainer import masked_mean, masked_var, masked_whiten

    values = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -7.0, 9.0]])
    mask = _mask()
    assert core.masked_mean(values, mask).item() == pytest.approx(3.0)
    assert core.masked_var(values, mask).item() == pytest.approx(2.5)  # unbiased: 10 / 4
    assert core.masked_var(values, mask, unbiased=False).item() == pytest.approx(2.0)
    assert torch.allclose(core.masked_mean(values, mask, dim=1), torch.tensor([2.0, 4.5]))
    torch.manual_seed(1)
    values, mask = torch.randn(6, 7), (torch.rand(6, 7) > 0.3).float()
    assert torch.allclose(core.masked_var(values, mask), masked_var(values, mask))
    for shift in (True, False):
        assert torch.allclose(core.masked_whiten(values, mask, shift), masked_whiten(values, mask, shift), atol=1e-6)
    assert torch.allclose(core.masked_mean(values, mask), masked_mean(values, mask))


def test_masked_positions_do_not_change_results():
    torch.manual_seed(2)
    values, mask = torch.randn(4, 6), (torch.rand(4, 6) > 0.4).float()
    mask[:, 0] = 1
    noisy = values + (1 - mask) * 1e4 * torch.randn(4, 6)
    assert torch.allclose(core.masked_whiten(values, mask) * mask, core.masked_whiten(noisy, mask) * mask, atol=1e-5)
    rewards = torch.randn(4, 6)
    right_padded = torch.tensor([[1] * k + [0] * (6 - k) for k in (6, 3, 1, 4)], dtype=torch.float32)
    a1, r1 = core.gae_advantages(rewards, values, right_padded, 0.9, 0.8)
    junk = (1 - right_padded) * 50 * torch.randn(4, 6)
    a2, r2 = core.gae_advantages(rewards + junk, values + junk, right_padded, 0.9, 0.8)
    assert torch.allclose(a1 * right_padded, a2 * right_padded, atol=1e-4)
    old = torch.randn(4, 6)
    l1, _ = live_policy_loss(values, old, rewards, right_padded, 0.2)
    l2, _ = live_policy_loss(values + junk * 100, old, rewards, right_padded, 0.2)
    assert l1.item() == pytest.approx(l2.item(), abs=1e-5)


def test_kl_estimators():
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    assert torch.allclose(core.kl_estimate(logp, ref, "k1"), torch.tensor([[0.5, -1.0]]))
    r = torch.exp(ref - logp)
    assert torch.allclose(core.kl_estimate(logp, ref, "k3"), (r - 1) - torch.log(r))
    assert (core.kl_estimate(logp, ref, "k3") >= 0).all()
    with pytest.raises(ValueError, match="k1"):
        core.kl_estimate(logp, ref, "k9")


def test_token_and_sequence_kl_rewards_by_hand():
    kl = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, -0.5, 9.0, 9.0]])
    mask, scores = _mask(), torch.tensor([2.0, -1.0])
    rewards, non_score = core.token_kl_rewards(scores, kl * mask, mask, kl_coef=0.5)
    assert torch.allclose(rewards, torch.tensor([[-0.05, -0.1, 2.0 - 0.15, 0.0], [-0.25, -1.0 + 0.25, 0.0, 0.0]]))
    assert torch.allclose(non_score.sum(1), torch.tensor([-0.3, 0.0]))
    rewards, _ = core.sequence_kl_rewards(scores, kl, mask, kl_coef=0.5)
    assert torch.allclose(rewards, torch.tensor([[0.0, 0.0, 2.0 - 0.3, 0.0], [0.0, -1.0, 0.0, 0.0]]))


def test_mask_one_past_last_and_score_after_it():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    extended = core.mask_one_past_last(mask)
    assert extended.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]]  # a full row has no room
    rewards, _ = core.token_kl_rewards(torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3, 4), extended, kl_coef=0.1)
    assert rewards.tolist() == [[0, 0, 0, 1.0], [0, 0, 2.0, 0], [0, 0, 0, 3.0]]


def test_gae_by_hand_and_against_the_tutorial_loop():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.5, 0.5]])
    adv, ret = core.gae_advantages(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    # lam = gamma = 1: advantage = return-to-go - V = 1 - 0.5 everywhere
    assert torch.allclose(adv, torch.full((1, 3), 0.5)) and torch.allclose(ret, torch.ones(1, 3))
    adv, _ = core.gae_advantages(rewards, values, torch.ones(1, 3), gamma=0.5, lam=0.5)
    d2, d1, d0 = 1.0 - 0.5, 0.0 + 0.25 - 0.5, 0.0 + 0.25 - 0.5
    a2 = d2
    a1 = d1 + 0.25 * a2
    a0 = d0 + 0.25 * a1
    assert torch.allclose(adv, torch.tensor([[a0, a1, a2]]))


def test_clipped_losses_by_hand():
    adv = torch.tensor([[1.0, -1.0]])
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 0.5]]))  # ratios 1.5 and 0.5
    loss, stats = live_policy_loss(new, old, adv, torch.ones(1, 2), cliprange=0.2)
    # token 0: max(-1.5, -1.2) = -1.2 ; token 1: max(0.5, 0.8) = 0.8
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert stats["clipfrac"].item() == pytest.approx(1.0)
    vloss, vstats = core.clipped_value_loss(
        torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[2.0]]), torch.ones(1, 1), cliprange_value=0.2
    )
    assert vloss.item() == pytest.approx(0.5 * (0.2 - 2.0) ** 2) and vstats["clipfrac"].item() == 1.0


@pytest.mark.needs_trl_ppo
def test_ppo_loss_equals_trl_formula_on_same_tensors():
    """TRL 1.12's PPO loss lines (ppo_trainer.py, inside train()) applied to the same tensors."""
    from trl.experimental.ppo.ppo_trainer import masked_mean

    torch.manual_seed(3)
    new, old, adv = torch.randn(5, 6), torch.randn(5, 6) * 0.1, torch.randn(5, 6)
    vpred, vold, ret = torch.randn(5, 6), torch.randn(5, 6), torch.randn(5, 6)
    mask = torch.rand(5, 6) > 0.3
    ratio = torch.exp(new - old)
    trl_pg = masked_mean(torch.max(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2)), mask)
    vclip = torch.clamp(vpred, vold - 0.2, vold + 0.2)
    trl_vf = 0.5 * masked_mean(torch.max(torch.square(vpred - ret), torch.square(vclip - ret)), mask)
    assert live_policy_loss(new, old, adv, mask, 0.2)[0].item() == pytest.approx(trl_pg.item(), abs=1e-6)
    assert core.clipped_value_loss(vpred, vold, ret, mask, 0.2)[0].item() == pytest.approx(trl_vf.item(), abs=1e-6)
