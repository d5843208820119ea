"""A KL shaping: the score minus ``kl_coef`` times the response's mean per-token KL, on its last token (a length
that does not change the penalty's scale, where ``sequence`` sums).

    trl-ext ppo ... --kl-mode recipes/extensions/mean_kl.py:mean_kl
"""

import torch

from trl_ext.ppo import core


@core.KL_SHAPINGS.register("mean_kl")
def mean_kl(scores, kl, mask, kl_coef):
    """Scores ``(B,)``, per-token KL ``(B, T)``, the mask where rewards land ``(B, T)`` -> ``(rewards,
    non_score_rewards)``, both ``(B, T)`` and zero on padding."""
    mask = mask.to(kl.dtype)
    penalty = -kl_coef * core.masked_mean(kl, mask, dim=1)
    rows, last = torch.arange(kl.shape[0], device=kl.device), core.last_token_index(mask)
    non_score = torch.zeros_like(kl)
    non_score[rows, last] = penalty
    rewards = non_score.clone()
    rewards[rows, last] += scores.to(kl.dtype)
    return rewards * mask, non_score * mask
