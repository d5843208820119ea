"""The backends of the doubling commands (``ppo --backend``, ``compare --backends``): each a runner of
``trl_ext.runners`` and the settings its row runs with."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from trl_ext.ppo.config import PPOConfig
from trl_ext.runners import GROUP_SIZE

# Our trainer configured as TRL's GRPO/RLOO rows run (one gradient step per batch, gradient clipping at 1.0
# as TRL's Trainer, kl_coef as their beta), so those rows differ in the trainer only.
_ONE_STEP = dict(num_ppo_epochs=1, num_mini_batches=1, max_grad_norm=1.0)


# 'bnpo': TRL's default 'dapo' is the same in one process with one step a generation (across ranks, 'dapo'
# normalises by every rank's tokens)
def _as_grpo(cfg: PPOConfig) -> dict:
    return dict(_ONE_STEP, advantage_estimator="grpo", num_generations=GROUP_SIZE, kl_coef=0.0, beta=cfg.kl_coef,
                loss_type="bnpo")


def _as_rloo(cfg: PPOConfig) -> dict:
    return dict(_ONE_STEP, advantage_estimator="rloo", num_generations=GROUP_SIZE, kl_estimator="k1",
                kl_mode="sequence", beta=0.0, policy_loss="sequence_clip", loss_type="grpo")


# The best critic-free settings found on the doubling task (README, "Critic-free estimators"). GRPO scales by the
# batch's std, not each group's: a group of near-equal scores had its noise blown up to unit size. '-quick' keeps
# one gradient step a batch (TRL's rows' speed) at lr 7e-4: 3e-4 ended less sharp when sampled, and 1e-3 broke one
# RLOO run of three on a second CPU (its KL spiking to 5; greedy 0.983). '-tuned' takes two epochs over each batch
# (TRL's num_iterations) at lr 1e-3: a little sharper, at about 1.5x the time.
def _as_rloo_quick(cfg: PPOConfig) -> dict:
    return dict(_as_rloo(cfg), learning_rate=7e-4)


def _as_grpo_quick(cfg: PPOConfig) -> dict:
    return dict(_as_grpo(cfg), learning_rate=7e-4, scale_rewards="batch")


def _as_rloo_tuned(cfg: PPOConfig) -> dict:
    return dict(_as_rloo_quick(cfg), num_ppo_epochs=2, learning_rate=1e-3)


def _as_grpo_tuned(cfg: PPOConfig) -> dict:
    return dict(_as_grpo_quick(cfg), num_ppo_epochs=2, learning_rate=1e-3)


def _as_reinforce_pp(cfg: PPOConfig) -> dict:  # KL-shaped token rewards, one completion per prompt
    return dict(_ONE_STEP, advantage_estimator="reinforce_pp", num_generations=1, beta=0.0)


@dataclass(frozen=True)
class Backend:
    runner: str  # a key of trl_ext.runners.RUNNERS
    algorithm: Callable[[PPOConfig], dict] | None = None  # a row's own settings, replacing the command line's

    def row_config(self, cfg: PPOConfig) -> PPOConfig:
        """The config this backend trains with, given the command's."""
        return replace(cfg, **self.algorithm(cfg)) if self.algorithm else cfg


# 'grpo'/'rloo'(-tuned): TRL's critic-free trainers, for comparison; 'scratch-ALGO': ours with the same config (a
# row's options replace those of the command line: a row is one fixed configuration)
BACKENDS: dict[str, Backend] = {
    "scratch": Backend("scratch"),
    "trl": Backend("trl"),
    "grpo": Backend("grpo", _as_grpo),
    "rloo": Backend("rloo", _as_rloo),
    "grpo-tuned": Backend("grpo", _as_grpo_tuned),
    "rloo-tuned": Backend("rloo", _as_rloo_tuned),
    "scratch-grpo": Backend("scratch", _as_grpo),
    "scratch-rloo": Backend("scratch", _as_rloo),
    "scratch-reinforce_pp": Backend("scratch", _as_reinforce_pp),
    "scratch-grpo-tuned": Backend("scratch", _as_grpo_tuned),
    "scratch-rloo-tuned": Backend("scratch", _as_rloo_tuned),
    "scratch-grpo-quick": Backend("scratch", _as_grpo_quick),
    "scratch-rloo-quick": Backend("scratch", _as_rloo_quick),
}
BACKEND_NAMES = tuple(BACKENDS)
