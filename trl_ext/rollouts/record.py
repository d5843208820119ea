"""The one record every kind of rollout returns, and what the trainer reads from it: the tensors of the update (a
single-turn rollout is the one-turn case: its loss mask is its attention mask), and what scoring hands the reward
functions (prompts, completions, completion ids, extra columns), and the rollout's own counters.

verl's agent loops return one ``AgentLoopOutput`` and SkyRL's generators one ``GeneratorOutput``: the trainer never
asks which kind of rollout made a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trl_ext.errors import InputError


@dataclass
class RolloutBatch:
    """A batch of rollouts on one device; tensors are ``(B, R)`` unless noted."""

    query_ids: torch.Tensor  # (B, P) left-padded prompts
    query_mask: torch.Tensor  # (B, P)
    responses: torch.Tensor  # the completions, right-padded
    loss_mask: torch.Tensor  # 1 on the tokens the policy sampled: the only ones trained
    attention_mask: torch.Tensor  # 1 on every completion token (an environment's are context, not trained)
    prompts: list  # as the reward functions receive them: text or conversations
    completions: list  # text, or the assistant's (and tools') messages
    completion_ids: list[list[int]]  # each completion's tokens, unpadded
    sampling_logprobs: torch.Tensor | None = None  # the engine's log-probs of ``responses``, where it knew them
    turn_rewards: torch.Tensor | None = None  # rewards on given tokens besides the score (a turn's last token)
    columns: dict = field(default_factory=dict)  # extra keywords for the reward functions (``environments``, ...)
    counters: dict[str, float] = field(default_factory=dict)  # sums over the batch, summed over processes
    rates: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # metric -> (counter, its divisor)

    def __post_init__(self):
        shape = self.responses.shape
        for name in ("loss_mask", "attention_mask", "sampling_logprobs", "turn_rewards"):
            value = getattr(self, name)
            if value is not None and value.shape != shape:
                raise InputError(f"a rollout's {name} is {tuple(value.shape)}, its responses {tuple(shape)}")
        rows = shape[0]
        for name in ("query_ids", "prompts", "completions", "completion_ids"):
            if len(getattr(self, name)) != rows:
                raise InputError(f"a rollout has {len(getattr(self, name))} {name} for {rows} responses")
        if bool((self.loss_mask.bool() & ~self.attention_mask.bool()).any()):
            raise InputError("a rollout's loss mask marks a token its attention mask leaves out")

    def __len__(self) -> int:
        return self.responses.shape[0]

    def rollout_metrics(self, counters: dict[str, float]) -> dict[str, float]:
        """This batch's metrics from ``counters`` (this record's, or summed over every process's): each ``rates``
        entry its counter over its divisor (0 where that is 0), or the counter itself where the divisor is None."""
        return {
            name: counters[top] if bottom is None else counters[top] / counters[bottom] if counters[bottom] else 0.0
            for name, (top, bottom) in self.rates.items()
        }
