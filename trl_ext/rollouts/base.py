"""The rollout seam: what every kind of rollout is (``Rollout``: the batch's rows and a way to sample in, one
``RolloutBatch`` out), what the trainer hands it to sample with (``Sampling``), and the registry that names the
kinds (``ROLLOUTS``: ``PPOConfig.rollout`` and ``--rollout`` pick one by name, or user code as ``module:name``).

A rollout holds no trainer. It samples only through ``Sampling``, and declares the reward functions it brings (an
environment's ``get_reward``) when it is built; the trainer adds them to its own, weight 1 each (TRL's rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from trl_ext.rollouts.record import RolloutBatch
from trl_ext.settings.registry import Registry

ROLLOUTS = Registry("rollout")


class Sampling(Protocol):
    """What a rollout samples with: the trainer's rollout engine under the trainer's sampling settings."""

    tokenizer: Any
    config: Any  # the trainer's PPOConfig: response_length, num_generations, skip_special_tokens, ...
    device: torch.device
    max_positions: int | None  # the model's context, which no query may reach
    trainer: Any  # for TRL's ``rollout_func(prompts, trainer)`` contract only: trl-ext's rollouts never touch it

    def pad(self, queries: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token lists -> left-padded ``(ids, mask)`` on the device."""

    def sample(
        self, query_ids: torch.Tensor, query_mask: torch.Tensor, max_new_tokens: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(responses, mask, sampling log-probs or None)``, each ``(B, W)``: pad after each row's first eos."""


class Rollout:
    """A kind of rollout. ``rollout(rows, sampling)`` is the one method to write; ``reward_funcs`` and ``check``
    are declarations with defaults."""

    reward_funcs: Sequence[Callable] = ()  # rewards this rollout brings besides the trainer's (weight 1 each)

    def check(self, config, tokenizer) -> None:
        """Once, when the trainer is built: refuse settings this rollout cannot train with, fit the tokenizer."""

    def rollout(self, rows: dict, sampling: Sampling) -> RolloutBatch:
        """One batch: ``rows`` are the dataset's columns (``input_ids``: the tokenized prompts, ``num_generations``
        rows a prompt, in order), each a list of the batch's values."""
        raise NotImplementedError
