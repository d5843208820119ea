"""trl-ext: PPO fine-tuning on Hugging Face TRL. ``from trl_ext import PPOConfig, PPOTrainer`` as from TRL.

The trainer is imported on first use, so ``import trl_ext`` (and its error classes) costs nothing.
"""

__all__ = ["PPOConfig", "PPOTrainer"]


def __getattr__(name: str):
    if name in __all__:
        import trl_ext.ppo

        return getattr(trl_ext.ppo, name)
    raise AttributeError(f"module 'trl_ext' has no attribute {name!r}")
