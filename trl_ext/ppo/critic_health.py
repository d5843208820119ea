"""Whether the critic is learning, measured each update before it trains on the batch.

One batch's explained variance is a poor signal alone: where a batch's returns are nearly constant (every answer
right, or every one wrong) ``Var(R)`` is tiny and the ratio swings to -100 and below while the critic is no worse
than before. So beside it an update logs:

- ``val/returns_var``: the batch's variance of the returns, the denominator, so a swing can be read for what it is;
- ``val/explained_variance_pooled``: the explained variance over the last ``HEALTH_WINDOW`` updates' values and
  returns together (each taken before its update), which one near-constant batch cannot blow up;
- ``val/first_value_return_corr``: across the batch, the correlation between the value at each response's first
  token and the return there: whether the critic ranks the prompts' prospects, the part of the value that
  becomes a baseline (0 where either side is constant, as a zero-initialised head's values are).

Each process measures its own rows; the update's metrics average them over processes. The window starts empty
when a run starts or resumes.
"""

from __future__ import annotations

from collections import deque

import torch

from trl_ext.ppo import core

HEALTH_WINDOW = 5  # updates pooled: long enough to average out a constant batch, short enough to follow learning


def first_token(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's value at its first masked position: ``(B, T), (B, T) -> (B,)`` (a row with none: its first)."""
    return values.gather(1, mask.bool().int().argmax(dim=1, keepdim=True)).squeeze(1)


def correlation(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pearson's correlation of two ``(B,)`` tensors, a scalar; 0 where either has no variance (it is undefined)."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    scale = torch.sqrt((x * x).sum() * (y * y).sum())
    if scale == 0:
        return scale.float()
    return ((x * y).sum() / scale).clamp(-1.0, 1.0).float()


class CriticHealth:
    """The critic's health metrics of each update (the module's text), and the window of updates they pool."""

    def __init__(self, window: int = HEALTH_WINDOW):
        self.window: deque[tuple[torch.Tensor, torch.Tensor]] = deque(maxlen=window)

    def observe(self, values: torch.Tensor, returns: torch.Tensor, value_mask: torch.Tensor) -> dict:
        """This update's metrics from its ``(B, T)`` values, returns and value mask (the critic's fit before the
        update), the batch added to the window first."""
        mask = value_mask.bool()
        self.window.append((values[mask].detach().float(), returns[mask].detach().float()))
        pooled_values = torch.cat([v for v, _ in self.window])[None]
        pooled_returns = torch.cat([r for _, r in self.window])[None]
        return {
            "val/explained_variance": core.explained_variance(values, returns, value_mask),
            "val/explained_variance_pooled": core.explained_variance(
                pooled_values, pooled_returns, torch.ones_like(pooled_values)
            ),
            "val/returns_var": core.masked_var(returns, value_mask, unbiased=False),
            "val/first_value_return_corr": correlation(first_token(values, mask), first_token(returns, mask)),
        }
