"""The policy loss of one minibatch: a registered per-token loss, an optional KL term, an aggregation.

``POLICY_LOSSES``: ``fn(logprobs, old_logprobs, advantages, mask, cliprange, **settings) -> (per_token_loss,
stats)``, all ``(B, T)``; ``settings`` are the loss's own keywords, given by the config's ``policy_loss_kwargs``.
``LOSS_AGGREGATIONS`` (the config's ``loss_type``, TRL's names): ``fn(per_token_loss, mask, max_length) -> scalar``,
with ``normaliser``: what its mean divides by, 'tokens' or 'rows' (the update's micro-batches weigh their losses by
their share of it). Policy losses say the same of their stats with ``stats_over``. Register a function to add one.
"""

from __future__ import annotations

import inspect

import torch

from trl_ext.errors import InputError
from trl_ext.ppo import core
from trl_ext.settings.registry import Registry

POLICY_LOSSES = Registry("policy_loss", stats_over="tokens")
LOSS_AGGREGATIONS = Registry("loss_type", normaliser="tokens")


@POLICY_LOSSES.register("clip")
def token_clip_loss(logprobs, old_logprobs, advantages, mask, cliprange, cliprange_high=None):
    """PPO's clipped surrogate with one ratio per token (TRL's PPO and GRPO), the ratio clipped to
    ``[1 - cliprange, 1 + cliprange_high]`` (DAPO's clip-higher; None: ``cliprange``)."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    loss, clipped = core.clipped_surrogate(ratio, advantages, cliprange, cliprange_high)
    with torch.no_grad():
        stats = {
            "clipfrac": core.masked_mean(clipped.float(), mask),
            "approxkl": 0.5 * core.masked_mean(log_ratio**2, mask),
            "ratio": core.masked_mean(ratio, mask),
        }
    return loss, stats


@POLICY_LOSSES.register("sequence_clip", stats_over="rows")
def sequence_clip_loss(logprobs, old_logprobs, advantages, mask, cliprange):
    """One ratio per sequence, ``exp(sum_t logp - sum_t logp_old)`` (TRL's RLOO); the sequence's loss
    is put on each of its tokens, so the 'grpo' (sequence-mean) aggregation gives RLOO's mean over sequences."""
    mask = mask.to(logprobs.dtype)
    log_ratio = ((logprobs - old_logprobs) * mask).sum(-1)
    ratio = torch.exp(log_ratio)
    sequence_advantages = core.masked_mean(advantages, mask, dim=1)
    loss, clipped = core.clipped_surrogate(ratio, sequence_advantages, cliprange)
    with torch.no_grad():
        stats = {"clipfrac": clipped.float().mean(), "approxkl": 0.5 * (log_ratio**2).mean(), "ratio": ratio.mean()}
    return loss[:, None].expand_as(logprobs), stats


@LOSS_AGGREGATIONS.register("bnpo")
def token_mean(per_token_loss, mask, max_length):
    """Mean over every unmasked token of the minibatch (PPO's; TRL's 'bnpo')."""
    return core.masked_mean(per_token_loss, mask)


@LOSS_AGGREGATIONS.register("grpo", normaliser="rows")
def sequence_mean(per_token_loss, mask, max_length):
    """Mean over sequences of each sequence's token mean (TRL's 'grpo'): short answers weigh more per token."""
    mask = mask.to(per_token_loss.dtype)
    return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


@LOSS_AGGREGATIONS.register("dr_grpo", normaliser="rows")
def fixed_length_mean(per_token_loss, mask, max_length):
    """Token sum over ``rows x max_length`` (TRL's 'dr_grpo', Liu et al. 2025): no length bias."""
    mask = mask.to(per_token_loss.dtype)
    return (per_token_loss * mask).sum() / (per_token_loss.shape[0] * max_length)


def loss_settings(config) -> dict:
    """The policy loss's own keywords: ``policy_loss_kwargs``, and ``cliprange_high`` where the config sets it (the
    flat option TRL's users know as ``epsilon_high``, a keyword of the loss like any other)."""
    settings = dict(config.policy_loss_kwargs or {})
    if config.cliprange_high is not None:
        settings["cliprange_high"] = config.cliprange_high
    return settings


def policy_loss(
    logprobs, old_logprobs, ref_logprobs, advantages, mask, config, importance_weights=None
) -> tuple[torch.Tensor, dict]:
    """``config.policy_loss`` per token with its settings (``loss_settings``), weighted by ``importance_weights``
    when the rollout engine's log-probs differ from the trainer's (``core.importance_sampling_weights``, ``(B, T)``
    or ``(B, 1)``), plus ``config.beta`` times the KL to the reference (GRPO's loss term, estimator
    ``config.kl_loss_estimator``, maybe ratio-weighted), aggregated by ``config.loss_type``."""
    fn = POLICY_LOSSES[config.policy_loss].fn
    per_token, stats = fn(logprobs, old_logprobs, advantages, mask, config.cliprange, **loss_settings(config))
    if importance_weights is not None:  # as TRL's GRPO: on the surrogate, not on the KL term
        per_token = per_token * importance_weights
    if config.beta > 0:
        kl = core.kl_estimate(logprobs, ref_logprobs, config.kl_loss_estimator)
        # TRL 1.16's use_bias_correction_kl (DeepSeek-V3.2): weighted by the differentiable ratio, 1 in value
        # on-policy, the term's gradient is that of the reverse KL without bias
        weighted = kl * torch.exp(logprobs - old_logprobs) if config.use_bias_correction_kl else kl
        per_token = per_token + config.beta * weighted
        with torch.no_grad():  # the term as the loss has it (TRL logs the same): off-policy, the weighted estimate
            stats["kl_loss"] = core.masked_mean(weighted, mask)
    loss = LOSS_AGGREGATIONS[config.loss_type].fn(per_token, mask, config.response_length)
    return loss, stats


def positive_lm_loss(
    logprobs: torch.Tensor, mask: torch.Tensor, positive: torch.Tensor, whole_tokens: torch.Tensor
) -> torch.Tensor:
    """VAPO's positive-example language-model loss (Yue et al. 2025): the negative log-likelihood of the tokens
    (``mask``, ``(B, T)``) of the rows marked ``positive`` ``(B,)``, summed and divided by ``whole_tokens``: the
    positive tokens of the whole minibatch, so that micro-batches add up to its token mean. 0 without any."""
    kept = mask.bool() & positive.bool()[:, None]
    return -torch.where(kept, logprobs, 0.0).sum() / whole_tokens.clamp(min=1.0)


POLICY_LOSS_ARGUMENTS = ("logprobs", "old_logprobs", "advantages", "mask", "cliprange")


def _own_parameters(name: str) -> tuple[dict, bool]:
    """The keywords the loss registered as ``name`` takes beyond ``POLICY_LOSS_ARGUMENTS``, and whether it takes
    any (``**kwargs``)."""
    parameters = list(inspect.signature(POLICY_LOSSES[name].fn).parameters.values())[len(POLICY_LOSS_ARGUMENTS) :]
    own = {p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return own, any(p.kind == p.VAR_KEYWORD for p in parameters)


def takes_setting(name: str, setting: str) -> bool:
    """Whether the loss registered as ``name`` takes the keyword ``setting``."""
    own, takes_any = _own_parameters(name)
    return takes_any or setting in own


def check_policy_loss_settings(name: str, settings: dict | None) -> None:
    """``settings`` (``loss_settings``) against the signature of the loss registered as ``name``: each a keyword
    it takes beyond ``POLICY_LOSS_ARGUMENTS``, and every such keyword without a default given."""
    settings = settings or {}
    own, takes_any = _own_parameters(name)
    unknown = sorted(set(settings) - set(own)) if not takes_any else []
    if unknown:
        raise InputError(
            f"policy_loss_kwargs {unknown}: policy loss {name!r} takes {', '.join(own) or 'no settings of its own'}"
        )
    missing = [n for n, p in own.items() if p.default is p.empty and n not in settings]
    if missing:
        raise InputError(f"policy loss {name!r} needs policy_loss_kwargs {missing}")


def policy_loss_shares(config, part_mask: torch.Tensor, whole_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch's shares of its minibatch for ``policy_loss``'s value and for its stats: by tokens or by
    rows, as the configured aggregation and policy loss average them."""
    return (
        share(LOSS_AGGREGATIONS[config.loss_type].normaliser, part_mask, whole_mask),
        share(POLICY_LOSSES[config.policy_loss].stats_over, part_mask, whole_mask),
    )


def share(normaliser: str, part_mask: torch.Tensor, whole_mask: torch.Tensor) -> torch.Tensor:
    """A micro-batch's share of its minibatch's normaliser ('tokens': unmasked tokens, 'rows': rows).

    A mean over the micro-batch times its share, summed over the micro-batches, is the mean over the
    whole minibatch: so accumulated gradients equal the minibatch's own, token means included.
    """
    if normaliser == "rows":
        return torch.tensor(part_mask.shape[0] / whole_mask.shape[0], device=part_mask.device)
    return part_mask.float().sum() / whole_mask.float().sum()
