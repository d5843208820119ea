"""Turn-level credit for multi-turn rollouts (Turn-PPO, arXiv 2512.17008; SWEET-RL, arXiv 2503.15478): the critic's
value of a turn is read at the turn's first model token, GAE runs over the turns of a row instead of its tokens, and
each turn's one advantage is spread over the turn's tokens. A token-level critic must carry the credit across every
token of every turn; here it bootstraps once a turn. A single-turn row is one turn: its advantage is its return less
the value at its first token.

Pure tensor math on rows whose model tokens are contiguous from the start (``advantages`` compacts them first,
``model_tokens``), ``(B, T)`` in and out; a turn is a run of model tokens, its boundaries marked by ``starts``.
"""

from __future__ import annotations

import torch


def turn_starts(loss_mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)``, 1 at each turn's first model token: a model token whose position before is not one (or is none)."""
    model = loss_mask.bool()
    before = torch.nn.functional.pad(model[:, :-1], (1, 0), value=False)
    return (model & ~before).to(loss_mask.dtype)


def turn_index(starts: torch.Tensor, value_mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` long: the 0-based turn of each position on ``value_mask`` (a position after a turn's last token,
    TRL 1.12's score position, belongs to that turn), -1 elsewhere."""
    turn = starts.long().cumsum(-1) - 1
    return torch.where(value_mask.bool(), turn.clamp(min=0), -1)


def turn_gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    value_mask: torch.Tensor,
    starts: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over turns: turn ``k``'s reward ``r_k`` is the sum of its positions' rewards, its value ``V_k`` the value at
    its first token; ``delta_k = r_k + gamma V_{k+1} - V_k`` (``V`` past the last turn is 0) and ``A_k = delta_k +
    gamma lam A_{k+1}``. Returns ``(advantages, returns)`` ``(B, T)``: each position on ``value_mask`` holds its turn's
    ``A_k`` and ``A_k + V_k``, 0 elsewhere (the critic's loss reads the returns at the turn starts)."""
    turn = turn_index(starts, value_mask)
    on = turn >= 0
    turns = int(turn.max().item()) + 1 if bool(on.any()) else 1
    safe = turn.clamp(min=0)
    dtype = rewards.dtype
    turn_rewards = torch.zeros(rewards.shape[0], turns, dtype=dtype, device=rewards.device)
    turn_rewards.scatter_add_(1, safe, torch.where(on, rewards, 0.0))
    first = on & starts.bool()
    spare = torch.where(first, turn, turns)  # every other position lands in a column dropped below
    columns = torch.zeros(rewards.shape[0], turns + 1, dtype=dtype, device=rewards.device)
    turn_values = columns.scatter(1, spare, torch.where(first, values.to(dtype), 0.0))[:, :turns]
    exists = columns.scatter(1, spare, first.to(dtype))[:, :turns]
    advantages = torch.zeros_like(turn_rewards)
    running = torch.zeros_like(turn_rewards[:, 0])
    for k in reversed(range(turns)):
        next_value = turn_values[:, k + 1] if k + 1 < turns else torch.zeros_like(running)
        delta = turn_rewards[:, k] + gamma * next_value - turn_values[:, k]
        running = (delta + gamma * lam * running) * exists[:, k]
        advantages[:, k] = running
    returns = advantages + turn_values
    spread = on.to(dtype)
    return advantages.gather(1, safe) * spread, returns.gather(1, safe) * spread
