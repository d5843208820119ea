"""What a rollout samples with (``trl_ext.rollouts.Sampling``), made of the trainer's engine and settings: the
rollout sees the engine's trimmed completions, never the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trl_ext.ppo.rollout.interface import trimmed


@dataclass
class TrainerSampling:
    trainer: Any  # handed on to TRL's rollout_func(prompts, trainer) only

    @property
    def tokenizer(self):
        return self.trainer.tokenizer

    @property
    def config(self):
        return self.trainer.config

    @property
    def device(self):
        return self.trainer.accelerator.device

    @property
    def max_positions(self) -> int | None:
        return getattr(self.trainer.policy.config, "max_position_embeddings", None)

    def pad(self, queries):
        return self.trainer._pad_queries(queries)

    def sample(self, query_ids, query_mask, max_new_tokens: int | None = None):
        sampled = self.trainer._sample(query_ids, query_mask, max_new_tokens=max_new_tokens)
        return trimmed(sampled, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
