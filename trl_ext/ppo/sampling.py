"""What a rollout samples with (``trl_ext.rollouts.Sampling``), made of the trainer's engine and settings: the
rollout sees the engine's trimmed completions, never the trainer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from trl_ext.data.batching import pad_batch
from trl_ext.data.prompt_dataset import max_positions
from trl_ext.ppo.rollout.samplers import Completions, SamplingOptions, trimmed
from trl_ext.ppo.sharding import gathered_for_rollout


@dataclass
class TrainerSampling:
    """``ahead_seed`` set: the sampling of a rollout that runs during an update (``max_staleness`` 1), which asks
    the engine for completions from the weights it holds and draws from a generator of its own; the trained module
    and the trainer's generator are left alone."""

    trainer: Any  # handed on to TRL's rollout_func(prompts, trainer) only
    ahead_seed: int | None = None

    def __post_init__(self):
        self.ahead = self.ahead_seed is not None
        self.generator = None
        if self.ahead:
            self.generator = torch.Generator(device=self.device).manual_seed(self.ahead_seed)

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
        return max_positions(self.trainer.policy)

    def pad(self, queries) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries (lists of token ids) left-padded, on the trainer's device."""
        ids, mask = pad_batch([list(q) for q in queries], self.tokenizer.pad_token_id, side="left")
        return ids.to(self.device), mask.to(self.device)

    def completions(
        self, query_ids, query_mask, temperature: float | None = None, max_new_tokens: int | None = None
    ) -> Completions:
        """The engine's completions, untrimmed. ``max_new_tokens``: a multi-turn rollout's later turns sample within
        what is left of response_length."""
        trainer = self.trainer
        options = SamplingOptions.of(self.config, self.tokenizer, temperature)
        if max_new_tokens is not None:
            options = dataclasses.replace(options, max_new_tokens=max_new_tokens)
        if self.ahead:  # the engine's own weights, synced by prepare() on the main thread
            return trainer.sampler.generate(query_ids, query_mask, options, generator=self.generator)
        policy, was_training = trainer.policy, trainer.policy.training
        policy.eval()
        try:
            with gathered_for_rollout(trainer.model), trainer.accelerator.autocast():
                return trainer.sampler.sample(policy, query_ids, query_mask, options, generator=trainer.generator)
        finally:
            policy.train(was_training)

    def prepare(self) -> None:
        """The engine brought to the policy's weights now (started first if need be), on the main thread."""
        trainer = self.trainer
        with gathered_for_rollout(trainer.model), torch.no_grad():
            trainer.sampler.prepare(trainer.policy, self.device, trainer.generator)

    def sample(self, query_ids, query_mask, max_new_tokens: int | None = None):
        sampled = self.completions(query_ids, query_mask, max_new_tokens=max_new_tokens)
        return trimmed(sampled, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
