"""What a PPO command trains and scores with: the options naming the policy and its rewards, and the
one reward built from them. ``ppo`` and ``rlhf`` differ in how a reward directory loads, not in this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trl_ext.options import field


@dataclass
class ModelOptions:
    """The policy and what scores it; each command's subclass says what its directories hold."""

    policy: str = field(help="directory of the policy")
    reward: str | None = field(None, help="directory of the reward model")
    reward_fn: str | None = field(None, help="your own reward function as 'module:callable' (TRL's reward_funcs "
                                  "convention); summed with --reward when both are given")
    reward_url: str | None = field(None, help="a reward server (`trl-ext serve-reward`) as the address it prints, "
                                   "e.g. http://127.0.0.1:8000; summed with --reward/--reward-fn when given")

    @property
    def has_reward(self) -> bool:
        return bool(self.reward or self.reward_fn or self.reward_url)


def reward_of(models: ModelOptions, load_reward_dir: Callable[[str], Callable]):
    """The reward PPO trains on: the reward directory, the user's function and the server, in that order;
    several are summed (``WeightedSum``, GRPO's rule for None)."""
    from trl_ext.commands.serve_reward import connect_reward
    from trl_ext.rewards import WeightedSum
    from trl_ext.rewards.base import import_reward_function

    # The server first: an unreachable one fails before any model loads.
    remote = connect_reward(models.reward_url) if models.reward_url else None
    rewards = []
    if models.reward:
        rewards.append(load_reward_dir(models.reward))
    if models.reward_fn:
        rewards.append(import_reward_function(models.reward_fn))
    if remote is not None:
        rewards.append(remote)
    return rewards[0] if len(rewards) == 1 else WeightedSum(rewards)
