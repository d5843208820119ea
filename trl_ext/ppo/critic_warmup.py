"""The critic's warm-up over a run: the first ``critic_warmup_steps`` updates train the value function alone, the
policy unchanged (OpenRLHF's and verl's critic warm-up), until the value loss stops falling where
``critic_warmup_patience`` is set (VC-PPO's value pretraining on the starting policy's rollouts)."""

from __future__ import annotations


def warmup_plateaued(value_losses: list[float], patience: int, min_delta: float) -> bool:
    """The warm-up's stopping rule: the last ``patience`` value losses hold none below ``(1 - min_delta)`` times the
    lowest before them (``patience`` 0: never, the warm-up runs its count)."""
    if patience <= 0 or len(value_losses) <= patience:
        return False
    return min(value_losses[-patience:]) >= (1.0 - min_delta) * min(value_losses[:-patience])


class CriticWarmup:
    """Whether an update is one of the warm-up's, and the warm-up updates' value losses its rule reads (saved in a
    checkpoint, so a resumed run's rule goes on where it was)."""

    def __init__(self, config):
        self.config = config
        self.value_losses: list[float] = []

    def active(self, update_index: int) -> bool:
        """Whether update ``update_index`` (0-based) warms the critic: one of the first ``critic_warmup_steps``, its
        value loss still falling where ``critic_warmup_patience`` is set."""
        cfg = self.config
        return update_index < cfg.critic_warmup_steps and not warmup_plateaued(
            self.value_losses, cfg.critic_warmup_patience, cfg.critic_warmup_min_delta
        )

    def record(self, metrics: dict) -> None:
        """A warm-up update's metrics: its value loss (the mean over processes, so every rank stops alike)."""
        if self.config.critic_warmup_patience:
            self.value_losses.append(float(metrics["loss/value_avg"]))
