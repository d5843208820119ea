"""Drop-in reward adapters: one reward object for TRL GRPO/RLOO, the in-house PPO and (through
``trl_ext.trl_compat.reward_model``) TRL 1.12's PPOTrainer."""

from trl_ext.rewards.base import RewardError, RewardFunction, call_reward, combine_rewards, validate_rewards
from trl_ext.rewards.classifier import ClassifierReward
from trl_ext.rewards.combine import Clipped, RunningNormalized, WeightedSum
from trl_ext.rewards.doubling import (
    CharsetCompliance, ExactMatch, ValueCorrect, doubling_classifier_reward, requested_label,
)

__all__ = [
    "CharsetCompliance", "ClassifierReward", "Clipped", "ExactMatch", "RewardError", "RewardFunction",
    "RunningNormalized", "ValueCorrect", "WeightedSum", "call_reward", "combine_rewards", "doubling_classifier_reward",
    "requested_label", "validate_rewards",
]
