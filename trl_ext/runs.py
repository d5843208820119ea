"""One training run as the commands run it, whatever trains it (``trl_ext.runners``)."""

from __future__ import annotations

from pathlib import Path

from trl_ext.ppo.config import PPOConfig


def resumed_update(cfg: PPOConfig, out: str | Path) -> int | None:
    """The update a ``--resume-from-checkpoint`` run goes on after; None for a fresh run."""
    if not cfg.resume_from_checkpoint:
        return None
    from trl_ext.ppo import checkpoint

    return checkpoint.read_state(checkpoint.resolve(cfg.resume_from_checkpoint, out))["update"]
