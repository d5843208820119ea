"""Drop-in reward adapters: one reward object for TRL GRPO/RLOO, the scratch trainer and (through
``trl_ext.trl_compat.reward_model``) TRL 1.12's PPOTrainer. The doubling task's own rewards live
in ``trl_ext.tasks.doubling.rewards``."""

from trl_ext.rewards.base import RewardError, RewardFunction, call_reward, combine_rewards, validate_rewards
from trl_ext.rewards.classifier import ClassifierReward
from trl_ext.rewards.combine import Clipped, WeightedSum
from trl_ext.rewards.messages import message_text
from trl_ext.rewards.remote import RemoteReward, RemoteRewardError

__all__ = [
    "ClassifierReward",
    "Clipped",
    "RemoteReward",
    "RemoteRewardError",
    "RewardError",
    "RewardFunction",
    "WeightedSum",
    "call_reward",
    "combine_rewards",
    "message_text",
    "validate_rewards",
]
