"""A policy loss with its own setting: DAPO's clip-higher (Yu et al. 2025), the ratio clipped to
``[1 - cliprange, 1 + cliprange_high]`` so that unlikely tokens with a positive advantage can grow further.

    trl-ext ppo ... --policy-loss recipes/extensions/clip_higher.py:clip_higher \
        --policy-loss-kwargs '{"cliprange_high": 0.28}'

``cliprange_high`` is this loss's own keyword: ``policy_loss_kwargs`` is checked against the signature.
The same rule is built in as ``PPOConfig(cliprange_high=0.28)`` (``--cliprange-high``) on the default ``clip``
loss; this file stays as the worked example of a policy loss with a setting of its own.
"""

import torch

from trl_ext.ppo import core
from trl_ext.ppo.losses import POLICY_LOSSES


@POLICY_LOSSES.register("clip_higher")
def clip_higher(logprobs, old_logprobs, advantages, mask, cliprange, cliprange_high=0.28):
    """``(B, T)`` in, the per-token loss ``(B, T)`` and its stats out, as the built-in ``clip``."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange_high)
    with torch.no_grad():
        stats = {
            "clipfrac": core.masked_mean((clipped > unclipped).float(), mask),
            "approxkl": 0.5 * core.masked_mean(log_ratio**2, mask),
            "ratio": core.masked_mean(ratio, mask),
        }
    return torch.maximum(unclipped, clipped), stats
