"""The rollout interface every engine implements (``trl_ext.ppo.rollout.samplers`` registers the engines): prompts in
as token ids, ``Completions`` out: ``(B, R)`` response ids with pad after each row's first eos and, where the
engine knows them, the log-probs it sampled those tokens with."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from trl_ext.data.sequences import response_mask
from trl_ext.errors import InputError


@dataclass(frozen=True)
class SamplingOptions:
    """How one rollout samples: the trainer's settings, the same for every engine."""

    max_new_tokens: int
    eos_token_id: int
    pad_token_id: int
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0: all tokens
    top_p: float = 1.0  # 1.0: all tokens
    repetition_penalty: float = 1.0  # only the 'generate' engine has one

    @classmethod
    def of(cls, config, tokenizer, temperature: float | None = None) -> SamplingOptions:
        """A trainer config's sampling settings (``temperature`` overrides its own: greedy evaluation)."""
        return cls(
            max_new_tokens=config.response_length,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            top_k=config.top_k,
            top_p=config.top_p,
            temperature=config.temperature if temperature is None else temperature,
            repetition_penalty=config.repetition_penalty,
        )


@dataclass
class Completions:
    """What an engine returns for a batch of prompts."""

    ids: torch.Tensor  # (B, R) sampled tokens, pad after the first eos
    logprobs: torch.Tensor | None = None  # (B, R) the engine's log-probs of ``ids``; None when it does not know them


def rank_and_world() -> tuple[int, int, int]:
    """``(rank, local rank, world size)`` of this training process (``(0, 0, 1)`` outside a process group)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return (
            torch.distributed.get_rank(),
            int(os.environ.get("LOCAL_RANK", torch.distributed.get_rank())),
            torch.distributed.get_world_size(),
        )
    return 0, 0, 1


def request_seeds(rows: int, generator: torch.Generator | None) -> list[int | None]:
    """One seed per request, drawn from the trainer's generator (seeded per rank), for engines that take a seed a
    request (vLLM's): rollouts are reproducible and the completions of one prompt's group differ (one seed for all
    would make them identical)."""
    if generator is None:
        return [None] * rows
    return torch.randint(0, 2**31 - 1, (rows,), generator=generator, device=generator.device).tolist()


def completions_of_rows(
    tokens: list[list[int]], logprobs: list[list[float]], pad_token_id: int, device: torch.device
) -> Completions:
    """Per-row token ids and their log-probs (an engine's outputs) as one padded ``Completions``."""
    width = max(1, max(len(t) for t in tokens))
    ids = torch.full((len(tokens), width), pad_token_id, dtype=torch.long)
    values = torch.zeros((len(tokens), width), dtype=torch.float32)
    for i, (row, row_logprobs) in enumerate(zip(tokens, logprobs)):
        if row:
            ids[i, : len(row)] = torch.tensor(row)
            values[i, : len(row)] = torch.tensor(row_logprobs[: len(row)], dtype=torch.float32)
    return Completions(ids.to(device), values.to(device))


def trimmed(completions: Completions, eos_token_id: int, pad_token_id: int):
    """``(responses, mask, sampling log-probs or None)``, each ``(B, W)``: columns past the longest response are
    padding in every row and dropped (the later passes cost less); pad and log-prob 0 after each eos."""
    mask = response_mask(completions.ids, eos_token_id)
    width = int(mask.sum(1).max())
    mask = mask[:, :width]
    responses = completions.ids[:, :width].masked_fill(mask == 0, pad_token_id)
    logprobs = None if completions.logprobs is None else completions.logprobs[:, :width] * mask
    return responses, mask, logprobs


class Sampler:
    """The interface; ``sample`` is the one method every engine implements."""

    returns_logprobs = False  # whether ``sample`` fills ``Completions.logprobs``: the importance-sampling correction
    holds_weights = False  # a copy of the policy's weights of its own (vLLM): it can sample while the policy trains

    def sample(
        self,
        model,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        options: SamplingOptions,
        generator: torch.Generator | None = None,
    ) -> Completions:
        raise NotImplementedError

    def prepare(self, model, device: torch.device, generator: torch.Generator | None = None) -> None:
        """An engine with weights of its own (``holds_weights``) takes ``model``'s now, so that ``generate`` can
        sample while the model trains (``max_staleness`` 1); the others have nothing to do."""

    def generate(self, query_ids, query_mask, options: SamplingOptions, generator=None) -> Completions:
        """Completions from the weights ``prepare`` gave the engine (engines that hold weights of their own)."""
        raise NotImplementedError(f"{type(self).__name__} samples from the model itself: call sample()")

    def policy_changed(self) -> None:
        """The policy's weights moved (an optimizer step, a loaded checkpoint). Engines that call the policy
        itself have nothing to do; one with its own copy of the weights syncs before its next rollout."""


class EngineSampler(Sampler):
    """An engine with a copy of the policy's weights of its own (vLLM, colocated or a server): ``prepare`` brings
    them up to date when the policy moved (``policy_changed``), ``generate`` samples from them, ``sample`` is the
    two. It returns its log-probs, and can sample while the policy trains (``max_staleness`` 1)."""

    returns_logprobs = True
    holds_weights = True
    _stale = True  # the engine's weights are not the policy's: sync before the next rollout

    def policy_changed(self) -> None:
        self._stale = True

    def sample(self, model, query_ids, query_mask, options, generator=None):
        self.prepare(model, query_ids.device, generator)
        return self.generate(query_ids, query_mask, options, generator)

    @staticmethod
    def check_options(options: SamplingOptions, engine: str) -> None:
        if options.repetition_penalty != 1.0:
            raise InputError(f"repetition_penalty needs sampler='generate' ({engine} has none, as the loop has none)")
