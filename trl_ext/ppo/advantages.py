"""From scored rollouts to advantages: every rule between the forward passes and the update, in one
pure function (``compute_advantages``), and the advantage estimators it looks up by name.

An estimator is ``fn(batch: EstimatorInputs, config) -> (advantages (B, T), returns (B, T) or None)``,
registered with ``@ADVANTAGE_ESTIMATORS.register(name, needs_values=..., whiten=..., needs_groups=...)``:
``needs_values`` (a critic must be trained: returns are its targets), ``whiten`` (advantages are
whitened over the batch unless ``config.whiten_advantages`` says otherwise), ``needs_groups`` (advantages
compare the completions of one prompt: ``num_generations`` must be at least 2), ``values_at_turns`` (the critic is
read and trained at each turn's first token alone, ``turn_credit``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from trl_ext.errors import InputError
from trl_ext.ppo import core, model_tokens, turn_credit
from trl_ext.settings.registry import Registry

ADVANTAGE_ESTIMATORS = Registry(
    "advantage_estimator", needs_values=False, whiten=False, needs_groups=False, values_at_turns=False
)


@dataclass
class EstimatorInputs:
    rewards: torch.Tensor  # (B, T) KL-shaped per-token rewards, zero off value_mask
    values: torch.Tensor | None  # (B, T) V_old, zero off value_mask; None without a critic
    mask: torch.Tensor  # (B, T) response tokens
    value_mask: torch.Tensor  # (B, T) where rewards and values live (mask, or one past it: TRL 1.12's p1)
    group_ids: torch.Tensor  # (B,) completions of one prompt share an id
    critic_lam: float | None = None  # this batch's lambda of the critic's returns (the warm-up's); None: config's
    turn_starts: torch.Tensor | None = None  # (B, T) 1 at each turn's first model token; None: one turn a row

    def sequence_returns(self) -> torch.Tensor:
        """Each row's total shaped reward (score minus its KL penalty): ``(B,)``."""
        return (self.rewards * self.value_mask).sum(-1)

    def per_token(self, sequence_advantages: torch.Tensor) -> torch.Tensor:
        """A ``(B,)`` advantage on every response token of its row."""
        return sequence_advantages[:, None] * self.mask.to(sequence_advantages.dtype)


@dataclass
class Advantages:
    """What ``compute_advantages`` derives from one batch (each ``(B, T)`` unless noted)."""

    advantages: torch.Tensor
    returns: torch.Tensor | None  # value targets; None for a critic-free estimator
    values: torch.Tensor | None  # V_old on value_mask
    scores: torch.Tensor  # (B,) after the missing-eos penalty
    kl: torch.Tensor  # per-token KL estimate on the response
    rewards: torch.Tensor  # KL-shaped (and maybe whitened) rewards
    non_score_rewards: torch.Tensor  # the KL part alone
    value_mask: torch.Tensor  # where the critic's values and returns are trained and measured


def _critic_lam(batch: EstimatorInputs, config) -> float:
    """The lambda of the critic's returns: the batch's (the warm-up's), else ``critic_lam``, else ``lam``."""
    return next(lam for lam in (batch.critic_lam, config.critic_lam, config.lam) if lam is not None)


@ADVANTAGE_ESTIMATORS.register("gae", needs_values=True, whiten=True)
def gae(batch: EstimatorInputs, config):
    """Generalised advantage estimation over the critic's values (PPO). The policy's advantages with ``lam``, or
    per row with ``core.length_adaptive_lambda`` (``lam_length_alpha``); the critic's returns with the batch's
    ``critic_lam``, else ``config.critic_lam``, else ``lam`` (VAPO's decoupled GAE; one pass where they agree)."""
    assert batch.values is not None  # needs_values: compute_advantages refuses a batch without them
    policy_lam = (
        config.lam
        if config.lam_length_alpha is None
        else core.length_adaptive_lambda(batch.mask, config.lam_length_alpha)
    )
    critic_lam = _critic_lam(batch, config)
    advantages, returns = core.gae_advantages(batch.rewards, batch.values, batch.value_mask, config.gamma, policy_lam)
    if config.lam_length_alpha is not None or critic_lam != config.lam:
        _, returns = core.gae_advantages(batch.rewards, batch.values, batch.value_mask, config.gamma, critic_lam)
    return advantages, returns


@ADVANTAGE_ESTIMATORS.register("turn_gae", needs_values=True, whiten=True, values_at_turns=True)
def turn_gae(batch: EstimatorInputs, config):
    """GAE over each row's turns (``turn_credit``): one advantage per assistant turn, spread over its tokens, the
    critic read at each turn's first token; the policy's lambda ``lam``, the critic's as ``gae``'s."""
    assert batch.values is not None and batch.turn_starts is not None
    inputs = batch.rewards, batch.values, batch.value_mask, batch.turn_starts, config.gamma
    advantages, returns = turn_credit.turn_gae_advantages(*inputs, config.lam)
    critic_lam = _critic_lam(batch, config)
    if critic_lam != config.lam:
        _, returns = turn_credit.turn_gae_advantages(*inputs, critic_lam)
    return advantages, returns


@ADVANTAGE_ESTIMATORS.register("grpo", needs_groups=True)
def grpo(batch: EstimatorInputs, config):
    """Each completion's return against its prompt's group, scaled by ``config.scale_rewards``."""
    sequence = core.group_normalised_scores(batch.sequence_returns(), batch.group_ids, config.scale_rewards)
    return batch.per_token(sequence), None


@ADVANTAGE_ESTIMATORS.register("rloo", needs_groups=True)
def rloo(batch: EstimatorInputs, config):
    """Each completion's return minus the mean return of the other completions of its prompt."""
    return batch.per_token(core.leave_one_out_advantages(batch.sequence_returns(), batch.group_ids)), None


@ADVANTAGE_ESTIMATORS.register("reinforce_pp", whiten=True)
def reinforce_pp(batch: EstimatorInputs, config):
    """REINFORCE++ (Hu 2025): reward-to-go of the KL-shaped token rewards, whitened over the batch."""
    return core.discounted_returns(batch.rewards, batch.value_mask, config.gamma) * batch.mask, None


def needs_values(config) -> bool:
    return ADVANTAGE_ESTIMATORS[config.advantage_estimator].needs_values


def whitens(config) -> bool:
    """Whether ``config``'s advantages are whitened: its ``whiten_advantages``, else its estimator's default."""
    if config.whiten_advantages is None:
        return ADVANTAGE_ESTIMATORS[config.advantage_estimator].whiten
    return config.whiten_advantages


def compute_advantages(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    values: torch.Tensor | None,
    loss_mask: torch.Tensor,
    ended: torch.Tensor,
    group_ids: torch.Tensor,
    config,
    kl_coef: float | None = None,
    token_rewards: torch.Tensor | None = None,
    critic_lam: float | None = None,
) -> Advantages:
    """Scores ``(B,)``, log-probs of policy and reference ``(B, T)``, values ``(B, T)`` (or None), the loss mask,
    ``ended`` ``(B,)`` (the last model token is eos) and group ids ``(B,)`` -> ``Advantages``.
    ``kl_coef``: the KL weight of this batch (an adaptive one's current value); default ``config.kl_coef``.
    ``token_rewards``: ``(B, T)`` rewards on given tokens besides the score (a multi-turn rollout's per-turn
    rewards, on each turn's last token): GAE credits them where they are, a sequence estimator sums them.
    ``critic_lam``: this batch's lambda of the critic's returns (the critic warm-up's); default the config's.

    ``loss_mask`` is 1 on the tokens the policy sampled. A multi-turn rollout's has holes (the environment's
    tokens): the model's tokens are moved to the front of each row (``model_tokens.model_token_order``; a single-turn
    row is already there), every rule runs there (``_contiguous_advantages``) and the results go back to their
    positions, 0 elsewhere. So KL, rewards, whitening and GAE see the model's tokens only, and the value before a
    tool result bootstraps from the value at the model's next token.
    """
    index, mask = model_tokens.model_token_order(loss_mask)
    # the score on the last model token, or one past it (TRL 1.12's p1: refused where an environment speaks last)
    value_mask = core.mask_one_past_last(mask) if config.score_position == "after_last_token" else mask

    def compact(x):
        return None if x is None else model_tokens.compact_tokens(x, index, value_mask)

    per_token = dict(
        logprobs=logprobs,
        ref_logprobs=ref_logprobs,
        values=values,
        token_rewards=token_rewards,
        turn_starts=turn_credit.turn_starts(loss_mask),
    )
    compacted = {name: compact(x) for name, x in per_token.items()}
    rules = dict(mask=mask, value_mask=value_mask, ended=ended, group_ids=group_ids, config=config, kl_coef=kl_coef)
    outcome = _contiguous_advantages(scores, **compacted, **rules, critic_lam=critic_lam)

    def expand(x):
        return None if x is None else model_tokens.expand_tokens(x, index, value_mask)

    # every (B, T) result back to its tokens' positions; the scores are per row
    back = {f.name: expand(getattr(outcome, f.name)) for f in fields(outcome) if f.name != "scores"}
    return Advantages(scores=outcome.scores, **back)


def _contiguous_advantages(
    scores,
    logprobs,
    ref_logprobs,
    values,
    mask,
    value_mask,
    ended,
    group_ids,
    config,
    kl_coef,
    token_rewards,
    critic_lam=None,
    turn_starts=None,
) -> Advantages:
    """The rules over rows whose tokens are contiguous from the start, in order: per-token KL; the missing-eos
    penalty; KL-shaped rewards (``kl_mode``); reward whitening; the estimator; advantage whitening.
    ``turn_starts``: 1 at each turn's first token (None: one turn a row)."""
    estimator = ADVANTAGE_ESTIMATORS[config.advantage_estimator]
    if estimator.needs_values and values is None:
        raise InputError(f"advantage_estimator {config.advantage_estimator!r} needs values, but there is no critic")
    mask = mask.to(logprobs.dtype)
    value_mask = value_mask.to(logprobs.dtype)
    kl = core.kl_estimate(logprobs, ref_logprobs, config.kl_estimator) * mask
    if config.missing_eos_penalty is not None:
        scores = torch.where(ended, scores, scores - config.missing_eos_penalty)
    if values is not None:
        values = values * value_mask
    rewards, non_score = core.KL_SHAPINGS[config.kl_mode].fn(
        scores, kl, value_mask, config.kl_coef if kl_coef is None else kl_coef
    )
    if token_rewards is not None:
        rewards = rewards + token_rewards.to(rewards.dtype) * value_mask
    if config.whiten_rewards:
        rewards = core.masked_whiten(rewards, value_mask, shift_mean=False) * value_mask
    if turn_starts is None:
        turn_starts = turn_credit.turn_starts(mask)
    advantages, returns = estimator.fn(
        EstimatorInputs(rewards, values, mask, value_mask, group_ids, critic_lam, turn_starts.to(mask.dtype)), config
    )
    if estimator.values_at_turns:  # the critic is read and trained at the turns' first tokens alone
        value_mask = value_mask * turn_starts.to(value_mask.dtype)
    if whitens(config):
        advantages = core.masked_whiten(advantages, mask) * mask
    return Advantages(
        advantages=advantages,
        returns=returns,
        values=values,
        scores=scores,
        kl=kl,
        rewards=rewards,
        non_score_rewards=non_score,
        value_mask=value_mask,
    )
