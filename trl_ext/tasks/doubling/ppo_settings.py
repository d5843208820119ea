"""The PPO options tuned on the doubling task (how: docs/decisions.md, "How the defaults were chosen").

``PPOConfig``'s own defaults are a real LLM run's (TRL's); the doubling commands (``ppo``, ``demo``,
``compare``), their recipes and the tests on the tiny models start from these instead.
"""

from __future__ import annotations

# 300 updates of 64 rollouts of at most 8 tokens, sampled at temperature 1.0.
DOUBLING_PPO = {
    "learning_rate": 3e-4,
    "batch_size": 64,
    "total_episodes": 19200,
    "response_length": 8,
    "temperature": 1.0,
    "kl_coef": 0.2,
    "vf_coef": 0.5,
}

# What the commands add. The charset classifier was trained on answers that end in the eos E: completions
# keep it. A separate critic: a shared one's value loss trains the backbone that computes the digits
# (docs/decisions.md, "What limits sampled accuracy").
DOUBLING_COMMAND_PPO = {**DOUBLING_PPO, "skip_special_tokens": False, "separate_critic": True}


def doubling_ppo_config(**options):
    """``PPOConfig`` with the doubling task's trainer values, then ``options``."""
    from trl_ext.ppo.config import PPOConfig

    return PPOConfig(**{**DOUBLING_PPO, **options})
