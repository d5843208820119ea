"""Pure PPO math for language models: tensors in, tensors out.

Shapes: ``B`` sequences, ``T`` response tokens. A ``mask`` is 1.0 (or True) on real response
tokens and 0 on padding; masked positions never change a result. No models, no config
objects, no accelerate: everything here can be checked by hand.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from trl_ext.errors import InputError
from trl_ext.settings.registry import Registry

# Rows of (tokens, V) logits taken at once below: the float32 working copies stay under about
# 2**24 elements (64 MB) whatever the vocabulary, instead of one float32 copy of the whole batch.
CHUNK_ELEMENTS = 2**24


def _row_chunks(logits: torch.Tensor) -> list[torch.Tensor]:
    """``(..., V)`` logits as slices of at most ``CHUNK_ELEMENTS`` elements, in row-major order of their rows.

    Views only: a sliced ``(B, T, V)`` tensor (response positions of the whole sequence) cannot be
    flattened without a copy, so it is cut along its first dimension instead (whole ``(T, V)`` rows at a
    time, or row by row when one is over the budget). Logits within the budget are one chunk.
    """
    if logits.numel() <= CHUNK_ELEMENTS:
        return [logits]
    rows = max(1, CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    if logits.dim() <= 2:
        return list(logits.reshape(-1, logits.shape[-1]).split(rows))
    try:
        return list(logits.view(-1, logits.shape[-1]).split(rows))
    except RuntimeError:
        per_row = logits[0, ..., 0].numel()
        if per_row <= rows:
            return list(logits.split(rows // per_row))
        return [chunk for row in logits for chunk in _row_chunks(row)]


def _positions(chunk: torch.Tensor) -> int:
    return chunk[..., 0].numel()


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits / temperature)[tokens]`` in float32: ``(B, T, V), (B, T) -> (B, T)``.

    A selective log-softmax: the chosen logit minus the row's logsumexp, over chunks of rows, so
    neither a ``(B, T, V)`` log-softmax nor a float32 copy of bf16 logits exists at once.
    With gradients, each chunk's float32 working copy is recomputed in the backward pass rather than kept:
    the graph holds the logits alone (2 bytes an element in bf16), not a float32 copy of them besides (4 more).
    """
    chunks = _row_chunks(logits)
    picked = []
    for chunk, ids in zip(chunks, tokens.reshape(-1).split([_positions(c) for c in chunks])):
        ids = ids.reshape(chunk.shape[:-1])
        if chunk.requires_grad:
            picked.append(checkpoint(selected_logprobs, chunk, ids, temperature, use_reentrant=False).reshape(-1))
        else:
            picked.append(selected_logprobs(chunk, ids, temperature).reshape(-1))
    return torch.cat(picked).reshape(tokens.shape)


def selected_logprobs(chunk: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    chunk = chunk.float() / temperature
    return chunk.gather(-1, ids[..., None]).squeeze(-1) - torch.logsumexp(chunk, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token entropy of ``softmax(logits / temperature)`` in float32: ``(B, T, V) -> (B, T)``, chunked as above."""
    entropies = []
    for chunk in _row_chunks(logits):
        if chunk.requires_grad:  # recomputed in the backward pass, as the log-probs above
            entropies.append(checkpoint(token_entropy, chunk, temperature, use_reentrant=False).reshape(-1))
        else:
            entropies.append(token_entropy(chunk, temperature).reshape(-1))
    return torch.cat(entropies).reshape(logits.shape[:-1])


def token_entropy(chunk: torch.Tensor, temperature: float) -> torch.Tensor:
    log_p = torch.log_softmax(chunk.float() / temperature, dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over positions where ``mask`` is set (no epsilon: an all-zero mask gives nan).

    ``where`` rather than ``values * mask``, so inf/nan on masked positions cannot leak in.
    """
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    count = mask.to(values.dtype)
    if dim is None:
        return kept.sum() / count.sum()
    return kept.sum(dim) / count.sum(dim)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over masked positions; ``unbiased`` applies Bessel's correction ``n / (n - 1)``."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.to(values.dtype).sum()
        if count < 2:
            raise ValueError(f"unbiased variance needs at least 2 unmasked values, got {int(count)}")
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` over masked positions (unbiased variance, as TRL).

    ``shift_mean=False`` scales but keeps the mean (used for rewards).
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


# Per-token estimates of KL(policy || ref) from samples of the policy (Schulman, "Approximating KL
# Divergence"), with ``r = ref / policy``. A new one is a function ``(logprobs, ref_logprobs) -> (B, T)``.
KL_ESTIMATORS = Registry("kl estimator")


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``log p - log q``: unbiased, can be negative (what TRL's PPO and RLOO use)."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``(log r)^2 / 2``: biased, non-negative, low variance."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``(r - 1) - log r``: unbiased, non-negative, lower variance than k1 (TRL's GRPO loss term)."""
    log_ratio = ref_logprobs - logprobs
    return torch.expm1(log_ratio) - log_ratio


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """The per-token KL estimate registered as ``estimator`` in ``KL_ESTIMATORS``."""
    return KL_ESTIMATORS[estimator].fn(logprobs, ref_logprobs)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last set position of each row of a right-padded mask (0 for an empty row)."""
    return (mask.long().sum(-1) - 1).clamp(min=0)


def mask_one_past_last(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` with the position right after each row's last set one set too, where the row has room.

    TRL 1.12's ``padding_mask_p1``: its PPO puts the score on that position and trains the value there.
    """
    lengths = mask.long().sum(-1, keepdim=True)
    positions = torch.arange(mask.shape[-1], device=mask.device)
    return (positions <= lengths).to(mask.dtype)


# Reward shapings, by the config's ``kl_mode``: ``fn(scores (B,), kl (B, T), mask (B, T), kl_coef) -> (rewards,
# non_score_rewards)``, both ``(B, T)`` and zero off ``mask`` (where rewards land).
KL_SHAPINGS = Registry("kl_mode")


@KL_SHAPINGS.register("token")
def token_kl_rewards(
    scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's PPO shaping: ``-kl_coef * kl`` on every token, the score added on the last one.

    Returns ``(rewards, non_score_rewards)``, both ``(B, T)`` and zero on padding.
    """
    mask = mask.to(kl.dtype)
    non_score = -kl_coef * kl * mask
    rewards = non_score.clone()
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    rewards[rows, last_token_index(mask)] += scores.to(rewards.dtype)
    return rewards * mask, non_score


def adaptive_kl_coef(kl_coef: float, observed_kl: float, target: float, horizon: float, episodes: int) -> float:
    """The KL weight after an update that measured ``observed_kl`` (mean over rollouts of each one's summed KL).

    Ziegler et al. 2019 (arXiv:1909.08593, section 2.2), the adaptive controller of TRL's PPO before 0.12:
    ``kl_coef * (1 + clip(observed_kl / target - 1, -0.2, 0.2) * episodes / horizon)``: a proportional
    step toward the target. ``episodes / horizon`` is capped at 1, so that an update larger than the horizon
    moves the weight by at most 20% and never to zero or below.
    """
    error = min(max(observed_kl / target - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * min(1.0, episodes / horizon))


@KL_SHAPINGS.register("sequence")
def sequence_kl_rewards(
    scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's RLOO shaping: one reward ``score - kl_coef * sum(kl)`` on the last token, zero elsewhere."""
    mask = mask.to(kl.dtype)
    penalty = -kl_coef * (kl * mask).sum(-1)
    rewards = torch.zeros_like(kl)
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    last = last_token_index(mask)
    rewards[rows, last] = scores.to(rewards.dtype) + penalty
    non_score = torch.zeros_like(kl)
    non_score[rows, last] = penalty
    return rewards * mask, non_score * mask


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over right-padded responses.

    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``; values and
    rewards are zeroed on padding, so the value after the last token is 0. ``lam``: one float, or one per
    row ``(B,)`` (``length_adaptive_lambda``). Returns ``(advantages, returns = advantages + values)``, both ``(B, T)``.
    """
    if isinstance(lam, torch.Tensor):
        lam = lam.to(values.dtype)
    mask = mask.to(values.dtype)
    values, rewards = values * mask, rewards * mask
    steps = rewards.shape[-1]
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(steps)):
        next_value = values[:, t + 1] if t + 1 < steps else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    return advantages, advantages + values


def length_adaptive_lambda(mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """VAPO's policy lambda (Yue et al. 2025, arXiv:2504.05118): ``1 - 1 / (alpha * length)`` per row, ``length``
    its set positions in ``mask`` ``(B, T)``; ``(B,)``, floored at 0 (a row shorter than ``1 / alpha`` tokens)."""
    lengths = mask.to(torch.float32).sum(-1).clamp(min=1.0)
    return (1.0 - 1.0 / (alpha * lengths)).clamp(min=0.0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """How much of the returns' variance the values explain: ``1 - Var(R - V) / Var(R)`` over ``mask``, ``(B, T)``
    in, a scalar out (1: perfect, 0: no better than the mean, below 0: worse). Where ``Var(R) = 0``: 1 where
    ``Var(R - V)`` is 0 too, else 0 (scikit-learn's ``force_finite``). Biased variances (their ratio is the same)."""
    mask = mask.bool()
    residual, total = masked_var(returns - values, mask, unbiased=False), masked_var(returns, mask, unbiased=False)
    if total > 0:
        return 1.0 - residual / total
    return (residual == 0).to(returns.dtype)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, cliprange: float, cliprange_high: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, negated for minimisation, element-wise: ``max(-A r, -A clip(r, 1-eps, 1+eps_high))``;
    ``eps_high`` is ``cliprange_high``, or ``cliprange`` where it is None (DAPO's clip-higher, Yu et al. 2025).

    Returns ``(loss, clipped)`` of the shape of ``ratio``; ``clipped`` is where the clipped term won.
    """
    high = cliprange if cliprange_high is None else cliprange_high
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float | None,
) -> tuple[torch.Tensor, dict]:
    """``0.5 * max((V - R)^2, (clip(V, V_old +- eps) - R)^2)`` averaged over masked tokens; ``cliprange_value`` None:
    ``0.5 * (V - R)^2``, unclipped."""
    unclipped = (values - returns) ** 2
    if cliprange_value is None:
        clipped = unclipped
    else:
        clipped_values = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
        clipped = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        stats = {"clipfrac": masked_mean((clipped > unclipped).float(), mask)}
    return loss, stats


def group_statistics(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row, the ``(mean, unbiased std, size)`` of its group: ``(B,), (B,) -> 3 x (B,)``.

    A group of one has std 0. ``group_ids`` may be any integers; rows of a group need not be adjacent.
    """
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    counts = counts.to(values.dtype)
    sums = torch.zeros_like(counts).index_add_(0, inverse, values)
    means = sums / counts
    squares = torch.zeros_like(counts).index_add_(0, inverse, (values - means[inverse]) ** 2)
    stds = torch.sqrt(squares / (counts - 1).clamp(min=1))
    return means[inverse], stds[inverse], counts[inverse]


def group_normalised_scores(
    returns: torch.Tensor, group_ids: torch.Tensor, scale: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """GRPO's advantage (Shao et al. 2024): ``(R - mean of its group) / (std + eps)``, ``(B,) -> (B,)``.

    ``scale``: 'group' divides by the group's std, 'batch' by the whole batch's, 'none' not at all
    (Dr. GRPO); stds are unbiased and ``eps = 1e-4``, as TRL's ``scale_rewards``.
    """
    means, stds, _ = group_statistics(returns, group_ids)
    centred = returns - means
    if scale == "none":
        return centred
    if scale == "batch":
        stds = returns.std() if returns.numel() > 1 else torch.zeros_like(returns)
    elif scale != "group":
        raise InputError(f"scale_rewards must be one of group, batch, none; got {scale!r}")
    return centred / (stds + eps)


def leave_one_out_advantages(returns: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO's advantage (Ahmadian et al. 2024): ``R_i`` minus the mean of the other returns of its group.

    ``(B,) -> (B,)``; a group of one has no baseline and gets advantage 0.
    """
    means, _, counts = group_statistics(returns, group_ids)
    others = (means * counts - returns) / (counts - 1).clamp(min=1)
    return torch.where(counts > 1, returns - others, torch.zeros_like(returns))


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Reward-to-go ``G_t = r_t + gamma G_{t+1}`` over right-padded rows (REINFORCE), ``(B, T) -> (B, T)``."""
    rewards = rewards * mask.to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def importance_sampling_weights(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_truncate",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """Truncated (or masked) importance weights of the trainer's log-probs over the sampler's (TRL GRPO's vLLM
    correction, Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training").

    ``(B, T)`` log-probs of the sampled tokens under the trainer and under the engine that sampled them;
    ``mask`` 1 on response tokens. ``mode``: ``token_*`` gives one ratio per token ``(B, T)``, ``sequence_*``
    one per row from the summed differences ``(B, 1)``; ``*_truncate`` clamps the ratio into
    ``[clip_min, clip_max]``, ``*_mask`` zeroes ratios outside it. No gradient flows through the weights.
    """
    level, rule = mode.split("_")
    diff = torch.where(mask.bool(), logprobs - sampling_logprobs, 0.0).detach()  # a tool token's -inf stays out
    if level == "sequence":
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if rule == "truncate":
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def ends_with(tokens: torch.Tensor, mask: torch.Tensor, token_id: int) -> torch.Tensor:
    """``(B,)``: whether the last set position of ``mask`` in each row holds ``token_id`` (False for an empty row)."""
    positions = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(mask.bool(), positions, -1).amax(-1)
    return (tokens.gather(-1, last.clamp(min=0)[:, None]).squeeze(-1) == token_id) & (last >= 0)
