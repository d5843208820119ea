"""Rollouts: every kind (single-turn, the tool loop, a ``step()`` environment, TRL's ``rollout_func``, a user's
own) behind one method that returns one record (``RolloutBatch``); the trainer reads only the record
(docs/architecture.md)."""

from trl_ext.rollouts.base import ROLLOUTS, Rollout, Sampling
from trl_ext.rollouts.build import build_rollout
from trl_ext.rollouts.record import RolloutBatch
from trl_ext.rollouts.step_environment import StepEnvironment

__all__ = ["ROLLOUTS", "Rollout", "RolloutBatch", "Sampling", "StepEnvironment", "build_rollout"]
