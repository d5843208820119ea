"""What a sampled batch's tensors mean, position by position: which tokens a response holds (up to its first eos),
each row's completion as a token list, position ids of left-padded rows, and TRL's conversational format."""

from __future__ import annotations

import torch


def response_mask(responses: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 on every token up to and including the first eos; 0 after it (the seed's answer_length)."""
    is_eos = (responses == eos_token_id).long()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0
    return (~after_eos).long()


def completion_token_ids(responses: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's response tokens up to and including eos, as lists (GRPO's ``completion_ids``)."""
    lengths = mask.long().sum(1).tolist()
    return [row[:n] for row, n in zip(responses.tolist(), lengths)]


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on the first real token of a left-padded row."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def is_conversation(value) -> bool:
    """TRL's conversational format: a list of ``{"role", "content"}`` messages."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)
