"""What a PPO command trains and scores with: the options naming the policy and its rewards (built into one
reward by ``trl_ext.rewards.loading.reward_of``). ``ppo`` and ``rlhf`` differ in how a reward directory loads."""

from __future__ import annotations

from dataclasses import dataclass

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

