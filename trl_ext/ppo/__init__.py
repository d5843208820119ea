"""The scratch trainer: pure math in ``core``, the loop in ``trainer``."""

from trl_ext.ppo import core
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.trainer import PPOError, PPOTrainer

__all__ = ["PPOConfig", "PPOError", "PPOTrainer", "core"]
