"""Multi-turn rollouts: the model's own tokens among the environment's. ``loss_mask`` is 1 on the tokens the
policy sampled and 0 on tool results and padding; these move the model's tokens to the front of each row, in order,
so that every rule written for right-padded responses (GAE, reward-to-go, where the score lands) runs over the
model's tokens alone and skips the environment's (verl's and slime's reported leak: KL, rewards and GAE reaching
masked tokens). Pure tensor math, as ``core``."""

from __future__ import annotations

import torch


def model_token_order(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, compact_mask)``, both ``(B, T)``: ``index[b, j]`` is the position of row b's j-th model token
    (then its other positions, in order); ``compact_mask`` is 1 on the first ``count_b`` columns of each row."""
    keep = loss_mask.bool()
    index = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices
    counts = keep.sum(-1, keepdim=True)
    compact_mask = (torch.arange(keep.shape[-1], device=keep.device) < counts).to(loss_mask.dtype)
    return index, compact_mask


def compact_tokens(values: torch.Tensor, index: torch.Tensor, compact_mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` values at the model's tokens, moved to the front of each row (``model_token_order``); 0 after."""
    return torch.where(compact_mask.bool(), values.gather(-1, index), 0.0)  # where: a -inf elsewhere stays out


def expand_tokens(compact: torch.Tensor, index: torch.Tensor, compact_mask: torch.Tensor) -> torch.Tensor:
    """The inverse of ``compact_tokens``: each value back at its model token's position, 0 on every other one."""
    compact = torch.where(compact_mask.bool(), compact, 0.0)
    return torch.zeros_like(compact).scatter(-1, index, compact)
