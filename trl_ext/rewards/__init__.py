"""Drop-in reward adapters: one reward object for TRL PPO, TRL GRPO/RLOO and the in-house trainer."""

from trl_ext.rewards.base import RewardError, RewardFunction, call_reward, validate_rewards
from trl_ext.rewards.classifier import ClassifierReward
from trl_ext.rewards.combine import Clipped, RunningNormalized, WeightedSum
from trl_ext.rewards.doubling import (
    CharsetCompliance, ExactMatch, ValueCorrect, doubling_classifier_reward, requested_label,
)
from trl_ext.rewards.ppo_adapter import PromptIndex, RewardFunctionModel, as_ppo_reward_model

__all__ = [
    "CharsetCompliance", "ClassifierReward", "Clipped", "ExactMatch", "PromptIndex", "RewardError",
    "RewardFunction", "RewardFunctionModel", "RunningNormalized", "ValueCorrect", "WeightedSum",
    "as_ppo_reward_model", "call_reward", "doubling_classifier_reward", "requested_label", "validate_rewards",
]
