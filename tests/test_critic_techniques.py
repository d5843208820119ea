"""The critic's techniques as settings (VC-PPO, VAPO, DAPO): what each computes by hand, each default as before,
each bad value one error, and a short run with all of them on."""

import json
import math
from pathlib import Path

import pytest
import torch

from trl_ext.errors import InputError
from trl_ext.ppo import core, losses
from trl_ext.ppo.advantages import compute_advantages
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.critic_warmup import warmup_plateaued
from trl_ext.ppo.trainer import PPOTrainer

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
VALUES = torch.tensor([[0.5, 1.0, 2.0, 7.0], [0.0, 0.0, 7.0, 7.0]])


def _gae(**overrides):
    """test_advantages.py's batch: shaped rewards [-0.25, 0, 2.25] and [0, -1.25], gamma 1, no whitening."""
    cfg = PPOConfig(kl_coef=0.5, gamma=1.0, whiten_advantages=False, **overrides)
    logprobs = torch.tensor([[-1.0, -1.0, -1.0, 0.0], [-2.0, -1.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5, 0.0], [-2.0, -1.5, 0.0, 0.0]])
    return compute_advantages(
        torch.tensor([2.0, -1.0]), logprobs, ref, VALUES, MASK, torch.tensor([True, True]), torch.tensor([0, 0]), cfg
    )


# reward-to-go of those rewards: the lambda = 1 returns
MONTE_CARLO = torch.tensor([[2.0, 2.25, 2.25, 0.0], [-1.25, -1.25, 0.0, 0.0]])
# lambda 0.5 by hand: deltas 0.25, 1, 0.25 and 0, -1.25; A_t = delta_t + 0.5 A_{t+1}
HALF = torch.tensor([[0.8125, 1.125, 0.25, 0.0], [-0.625, -1.25, 0.0, 0.0]])


def test_gae_takes_one_lambda_per_row():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.25, 0.5], [0.5, 0.25, 0.5]])
    advantages, returns = core.gae_advantages(rewards, values, torch.ones(2, 3), 1.0, torch.tensor([0.0, 1.0]))
    # lambda 0: the one-step deltas; lambda 1: reward-to-go minus the value
    assert torch.allclose(advantages, torch.tensor([[-0.25, 0.25, 0.5], [0.5, 0.75, 0.5]]))
    assert torch.allclose(returns, advantages + values)
    same, _ = core.gae_advantages(rewards, values, torch.ones(2, 3), 0.9, torch.tensor([0.5, 0.5]))
    assert torch.allclose(same, core.gae_advantages(rewards, values, torch.ones(2, 3), 0.9, 0.5)[0])


def test_length_adaptive_lambda_by_hand():
    lengths = [40, 100, 10]
    mask = torch.zeros(3, 100)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    # 1 - 1/(0.05 * 40) = 0.5, 1 - 1/5 = 0.8; 1 - 1/0.5 = -1 floored at 0
    assert torch.allclose(core.length_adaptive_lambda(mask, 0.05), torch.tensor([0.5, 0.8, 0.0]))


def test_decoupled_gae_policy_from_lam_critic_from_critic_lam():
    out = _gae(lam=0.5, critic_lam=1.0)
    assert torch.allclose(out.advantages, HALF) and torch.allclose(out.returns, MONTE_CARLO)
    # and the other way round: the policy's lambda 1, the critic's 0.5
    swapped = _gae(lam=1.0, critic_lam=0.5)
    assert torch.allclose(swapped.advantages, MONTE_CARLO - VALUES * MASK)
    assert torch.allclose(swapped.returns, (HALF + VALUES) * MASK)
    # a batch's own critic lambda (the warm-up's) comes before the config's
    logprobs = torch.tensor([[-1.0, -1.0, -1.0, 0.0], [-2.0, -1.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5, 0.0], [-2.0, -1.5, 0.0, 0.0]])
    warm = compute_advantages(
        torch.tensor([2.0, -1.0]),
        logprobs,
        ref,
        VALUES,
        MASK,
        torch.tensor([True, True]),
        torch.tensor([0, 0]),
        PPOConfig(kl_coef=0.5, gamma=1.0, lam=0.5, whiten_advantages=False),
        critic_lam=1.0,
    )
    assert torch.allclose(warm.advantages, HALF) and torch.allclose(warm.returns, MONTE_CARLO)


def test_length_adaptive_gae_uses_each_rows_lambda_for_the_policy_only():
    # lengths 3 and 2 at alpha 0.5: lambdas 1 - 1/1.5 = 1/3 and 0; the critic keeps lam = 1
    out = _gae(lam=1.0, lam_length_alpha=0.5)
    row0 = [0.25 + (1 + 0.25 / 3) / 3, 1 + 0.25 / 3, 0.25, 0.0]
    assert torch.allclose(out.advantages, torch.tensor([row0, [0.0, -1.25, 0.0, 0.0]]))
    assert torch.allclose(out.returns, MONTE_CARLO)


def test_gae_at_its_defaults_is_one_pass_of_lam_bit_for_bit():
    out = _gae()
    expected, returns = core.gae_advantages(out.rewards, out.values, out.value_mask, 1.0, 0.95)
    assert torch.equal(out.advantages, expected) and torch.equal(out.returns, returns)


def test_explained_variance_by_hand():
    returns = torch.tensor([[1.0, 2.0, 99.0], [3.0, 4.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    assert core.explained_variance(returns, returns, mask).item() == 1.0
    assert core.explained_variance(torch.full_like(returns, 2.5), returns, mask).item() == 0.0
    # residuals +-0.5 (variance 0.25) over returns of variance 1.25: 1 - 0.2
    off = returns - torch.tensor([[0.5, -0.5, -50.0], [0.5, -0.5, 7.0]])
    assert core.explained_variance(off, returns, mask).item() == pytest.approx(0.8)
    flat = torch.ones(2, 3)
    assert core.explained_variance(flat, flat, mask).item() == 1.0
    assert core.explained_variance(flat * 0.5, flat, mask).item() == 1.0  # an offset: Var(R - V) is 0 too
    assert core.explained_variance(flat * VALUES[:, :3], flat, mask).item() == 0.0


def test_warmup_stopping_rule_by_hand():
    assert not warmup_plateaued([5.0, 4.0, 4.5], 0, 0.0)  # patience 0: the count alone
    assert not warmup_plateaued([5.0, 4.0], 2, 0.0)  # not enough losses yet
    assert warmup_plateaued([5.0, 4.0, 4.5, 4.0], 2, 0.0)  # 4.5 and 4.0: none below 4.0
    assert not warmup_plateaued([5.0, 4.0, 4.5, 3.9], 2, 0.0)
    assert warmup_plateaued([5.0, 4.0, 4.5, 3.9], 2, 0.05)  # 3.9 is not 5% below 4.0


def test_clip_higher_by_hand_and_as_the_recipes_loss():
    ratio, advantages = torch.tensor([1.25, 1.25, 0.7]), torch.tensor([1.0, -1.0, -1.0])
    loss, clipped = core.clipped_surrogate(ratio, advantages, 0.2, 0.28)
    # 1.25 is inside [0.8, 1.28]: unclipped for A > 0; for A < 0 the max keeps -A r either way; 0.7 clips at 0.8
    assert torch.allclose(loss, torch.tensor([-1.25, 1.25, 0.8])) and clipped.tolist() == [False, False, True]
    assert torch.allclose(core.clipped_surrogate(ratio, advantages, 0.2)[0], torch.tensor([-1.2, 1.25, 0.8]))
    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "extensions" / "clip_higher.py") + ":clip_higher"
    user_loss = losses.POLICY_LOSSES[PPOConfig(policy_loss=recipe).policy_loss].fn  # imported once, as a user's file
    logp = torch.tensor([[-1.0, -0.5, -2.0, 0.0], [-0.2, -1.0, 0.0, 0.0]])
    old, adv = logp - torch.tensor([[0.3, -0.4, 0.1, 0.0], [0.25, 0.0, 0.0, 0.0]]), torch.ones(2, 4)
    built_in, _ = losses.policy_loss(logp, old, old, adv, MASK, PPOConfig(cliprange_high=0.28))
    per_token, _ = user_loss(logp, old, adv, MASK, 0.2, cliprange_high=0.28)
    assert torch.equal(built_in, core.masked_mean(per_token, MASK))
    # the option is the registered clip's keyword: the same loss as given through policy_loss_kwargs
    as_kwarg, _ = losses.policy_loss(logp, old, old, adv, MASK, PPOConfig(policy_loss_kwargs={"cliprange_high": 0.28}))
    assert torch.equal(built_in, as_kwarg)


def test_clip_at_its_default_is_the_symmetric_clip_bit_for_bit():
    logp = torch.tensor([[-1.0, -0.5, -2.0, 0.0], [-0.2, -1.0, 0.0, 0.0]])
    old, adv = logp - torch.tensor([[0.3, -0.4, 0.1, 0.0], [0.25, 0.0, 0.0, 0.0]]), torch.tensor([[1.0, -1, 2, 0]] * 2)
    loss, _ = losses.policy_loss(logp, old, old, adv, MASK, PPOConfig())
    ratio = torch.exp(logp - old)
    today = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - 0.2, 1.0 + 0.2))
    assert torch.equal(loss, core.masked_mean(today, MASK))


def test_positive_lm_loss_by_hand_and_over_micro_batches():
    logp = torch.tensor([[-1.0, -2.0, -3.0, -9.0], [-4.0, -5.0, -9.0, -9.0], [-0.5, -9.0, -9.0, -9.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    positive = torch.tensor([True, False, True])
    whole = torch.tensor(4.0)  # the positive rows' tokens: 3 + 1
    assert losses.positive_lm_loss(logp, mask, positive, whole).item() == pytest.approx((1 + 2 + 3 + 0.5) / 4)
    parts = sum(losses.positive_lm_loss(logp[i : i + 1], mask[i : i + 1], positive[i : i + 1], whole) for i in range(3))
    assert parts.item() == pytest.approx(6.5 / 4)
    assert losses.positive_lm_loss(logp, mask, torch.zeros(3, dtype=torch.bool), torch.tensor(0.0)).item() == 0.0


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(critic_lam=1.5), "critic_lam must be within"),
        (dict(critic_lam=1.0, advantage_estimator="grpo", num_generations=2), "critic_lam is gae's"),
        (dict(lam_length_alpha=0.0), "lam_length_alpha must be positive"),
        (dict(cliprange_high=-0.1), "cliprange_high must not be negative"),
        (dict(cliprange_high=0.28, policy_loss="sequence_clip"), "cliprange_high is a keyword of the policy loss"),
        (dict(positive_lm_coef=-1.0), "positive_lm_coef must not be negative"),
        (dict(critic_warmup_patience=-1, critic_warmup_steps=4), "critic_warmup_patience must not be negative"),
        (dict(critic_warmup_patience=2), "need critic_warmup_steps"),
        (dict(critic_warmup_lam=1.0), "need critic_warmup_steps"),
        (dict(critic_warmup_lam=2.0, critic_warmup_steps=4), "critic_warmup_lam must be within"),
        (dict(critic_warmup_min_delta=1.0, critic_warmup_steps=4, critic_warmup_patience=1), "fraction of the loss"),
    ],
)
def test_bad_settings_are_one_input_error(options, message):
    with pytest.raises(InputError, match=message):
        PPOConfig(**options)


def _length(completions, **_):
    return [float(len(c)) for c in completions]


def _trainer(tokenizer, **options):
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    base = dict(
        batch_size=4,
        num_ppo_epochs=2,
        num_mini_batches=2,
        total_episodes=8,
        response_length=5,
        learning_rate=1e-2,
        temperature=1.0,
    )
    config = PPOConfig(**{**base, **options})
    return PPOTrainer(
        build_policy(tokenizer),
        _length,
        args=config,
        train_dataset=ppo_prompt_dataset(tokenizer, 4 * config.total_episodes, seed=0),
        processing_class=tokenizer,
    )


def test_warmup_stops_when_the_value_loss_stops_falling_with_lambda_one_returns(tokenizer, monkeypatch):
    import trl_ext.ppo.trainer as trainer_module

    lams = []
    real = trainer_module.make_experience

    def make_experience(passes, batch, scores, config, options):
        lams.append(options.critic_lam)
        return real(passes, batch, scores, config, options)

    monkeypatch.setattr(trainer_module, "make_experience", make_experience)
    # a cap of 10, patience 1, and only a fall to under 1% of the best counts: the warm-up ends after 2 updates
    trainer = _trainer(
        tokenizer,
        total_episodes=12,
        critic_warmup_steps=10,
        critic_warmup_patience=1,
        critic_warmup_min_delta=0.99,
        critic_warmup_lam=1.0,
    )
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    moved = []

    def watch(update, stats):
        moved.append(any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters())))

    trainer.train(on_update=watch)
    assert moved == [False, False, True] and lams == [1.0, 1.0, None]
    assert len(trainer.critic_warmup.value_losses) == 2


def test_a_run_resumed_during_its_warmup_goes_on_with_the_stopping_rule(tokenizer, tmp_path):
    """The warm-up's value losses travel in the checkpoint: resumed after its first warm-up update, the run warms up
    once more and then trains the policy, as the run that was never stopped did (started afresh, the rule would
    need two new losses and warm up to the end)."""
    warmup = dict(critic_warmup_steps=10, critic_warmup_patience=1, critic_warmup_min_delta=0.99)
    whole = _trainer(tokenizer, total_episodes=12, output_dir=str(tmp_path), save_steps=1, **warmup)
    whole.train()
    saved = json.loads((tmp_path / "checkpoint-1" / "trainer_state.json").read_text())
    assert saved["warmup_value_losses"] == whole.critic_warmup.value_losses[:1]
    resumed = _trainer(
        tokenizer,
        total_episodes=12,
        output_dir=str(tmp_path),
        resume_from_checkpoint=str(tmp_path / "checkpoint-1"),
        **warmup,
    )
    assert resumed.critic_warmup.value_losses == whole.critic_warmup.value_losses[:1]
    before = [p.detach().clone() for p in resumed.policy.parameters()]
    moved = []
    resumed.train(
        on_update=lambda *_: moved.append(
            any(not torch.equal(a, b) for a, b in zip(before, resumed.policy.parameters()))
        )
    )
    assert moved == [False, True] and len(resumed.critic_warmup.value_losses) == 2


def test_gae_with_several_samples_a_prompt_sees_each_completion_as_its_own_trajectory(tokenizer, monkeypatch):
    """num_generations 4 with GAE: each batch is one prompt's 4 completions, and their advantages and returns are
    the ones every completion would get in a group of its own (grouping is the critic-free estimators' business)."""
    import trl_ext.ppo.trainer as trainer_module

    seen, make = [], trainer_module.make_experience

    def recording(passes, batch, scores, config, options):
        made = make(passes, batch, scores, config, options)
        seen.append((batch, scores, made[0], config, options))
        return made

    monkeypatch.setattr(trainer_module, "make_experience", recording)
    history = _trainer(tokenizer, num_generations=4, loss_type="grpo").train()
    assert len(history) == 2 and all(math.isfinite(h["loss/value_avg"]) for h in history)
    assert len(seen) == 2
    for batch, scores, exp, config, options in seen:
        assert len(set(batch.prompts)) == 1 and len(batch.prompts) == 4
        out = exp.outcome
        alone = compute_advantages(
            scores, exp.old_logprobs, exp.ref_logprobs, out.values, exp.mask,
            core.ends_with(exp.responses, exp.mask, options.eos_token_id), torch.arange(4), config, options.kl_coef,
        )  # fmt: skip
        assert torch.equal(alone.advantages, out.advantages) and torch.equal(alone.returns, out.returns)


def test_defaults_log_explained_variance_and_equal_their_neutral_values(tokenizer):
    torch.manual_seed(0)
    default = _trainer(tokenizer).train()
    torch.manual_seed(0)
    neutral = _trainer(tokenizer, critic_lam=0.95, positive_lm_threshold=3.0, critic_warmup_min_delta=0.5).train()
    for a, b in zip(default, neutral):
        numbers = {k for k, v in a.items() if isinstance(v, float) and not k.startswith(("timing/", "eps"))}
        assert {k: a[k] for k in numbers} == {k: b[k] for k in numbers}
    assert all(math.isfinite(h["val/explained_variance"]) for h in default)
    assert "loss/positive_lm_avg" not in default[0]


def test_all_techniques_on_train_and_log(tokenizer):
    history = _trainer(
        tokenizer,
        num_generations=2,
        critic_warmup_steps=1,
        critic_warmup_patience=1,
        critic_warmup_lam=1.0,
        critic_lam=1.0,
        lam_length_alpha=0.5,
        cliprange_high=0.28,
        positive_lm_coef=0.1,
        positive_lm_threshold=2.0,
    ).train()
    assert len(history) == 2
    for stats in history:
        for name in ("val/explained_variance", "loss/positive_lm_avg", "loss/value_avg", "loss/policy_avg"):
            assert math.isfinite(stats[name]), name
