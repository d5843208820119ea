"""Options of the in-house PPO trainer; names follow TRL's ``PPOConfig`` where the meaning is the same."""

from __future__ import annotations

from dataclasses import dataclass

from trl_ext.config import field


@dataclass
class PPOConfig:
    output_dir: str | None = field(None, help="where a bad loss saves the last good policy (the CLI sets it from --out)",
                                   cli=False)
    learning_rate: float = field(3e-4, help="AdamW learning rate")
    lr_scheduler_type: str = field("linear", help="'linear': decay to 0 over the run (TRL's default); 'constant'",
                                   choices=("linear", "constant"))
    batch_size: int = field(64, help="rollouts per update on each process (TRL: per_device_train_batch_size)")
    num_mini_batches: int = field(1, help="minibatches per PPO epoch; batch_size gives the seed's per-sample updates")
    num_ppo_epochs: int = field(4, help="passes over each batch of rollouts")
    total_episodes: int = field(19200, help="rollouts in the whole run, over all processes (300 updates of 64)")
    kl_coef: float = field(0.2, help="weight of the KL penalty to the reference policy")
    kl_estimator: str = field("k1", help="per-token KL estimate", choices=("k1", "k3"))
    kl_mode: str = field("token", help="'token': -kl_coef*kl per token (seed 000, TRL); "
                         "'sequence': score - kl_coef*sum(kl) on the last token (seed 004)",
                         choices=("token", "sequence"))
    cliprange: float = field(0.2, help="policy ratio clip")
    cliprange_value: float = field(0.2, help="value clip around the old values")
    vf_coef: float = field(0.5, help="value loss weight (the seed uses 0.1; 0.5 learned the shared critic faster)")
    ent_coef: float = field(0.0, help="entropy bonus weight")
    gamma: float = field(1.0, help="discount")
    lam: float = field(0.95, help="GAE lambda")
    whiten_rewards: bool = field(False, help="whiten the shaped rewards before GAE")
    response_length: int = field(8, help="most tokens a response may have")
    temperature: float = field(1.0, help="sampling temperature of rollouts")
    max_grad_norm: float = field(0.0, help="gradient clipping norm; 0 turns clipping off (TRL's PPO never clips)")
    separate_critic: bool = field(False, help="value head on a copy of the backbone instead of the shared one")
    seed: int = field(0, help="seed for prompt order, sampling and initialisation")
    reward_weights: list[float] | None = field(None, help="one weight per reward function (GRPO's option); "
                                               "default: all 1.0", cli=False)
    skip_special_tokens: bool = field(True, help="decode completions for reward functions without special tokens, "
                                      "as TRL's GRPO does; False keeps the eos the reward model may expect")

    def __post_init__(self):
        for name in ("learning_rate", "batch_size", "num_mini_batches", "num_ppo_epochs", "total_episodes",
                     "response_length", "temperature"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("max_grad_norm", "kl_coef", "cliprange", "cliprange_value", "vf_coef", "ent_coef", "gamma", "lam"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.batch_size % self.num_mini_batches:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by num_mini_batches "
                             f"{self.num_mini_batches}")
        if self.lr_scheduler_type not in ("linear", "constant"):
            raise ValueError(f"lr_scheduler_type must be 'linear' or 'constant', got {self.lr_scheduler_type!r}")
        if self.kl_estimator not in ("k1", "k3"):
            raise ValueError(f"kl_estimator must be 'k1' or 'k3', got {self.kl_estimator!r}")
        if self.reward_weights is not None:
            if not isinstance(self.reward_weights, (list, tuple)) or not self.reward_weights or \
                    not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in self.reward_weights):
                raise ValueError(f"reward_weights must be a non-empty list of numbers, got {self.reward_weights!r}")
            self.reward_weights = [float(w) for w in self.reward_weights]
        if self.kl_mode not in ("token", "sequence"):
            raise ValueError(f"kl_mode must be 'token' or 'sequence', got {self.kl_mode!r}")


def mini_batch_size(config: PPOConfig) -> int:
    return config.batch_size // config.num_mini_batches


def num_updates(config: PPOConfig, world_size: int) -> int:
    """Updates in the run: ``total_episodes`` over the rollouts all processes make per update (rounded up)."""
    per_update = config.batch_size * world_size
    return max(1, -(-config.total_episodes // per_update))
