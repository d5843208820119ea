"""Rollouts a caller brings (the classic step-wise ``PPOTrainer.step``): queries and responses as token ids, checked
and put in the one record as one-turn rollouts."""

from __future__ import annotations

import torch

from trl_ext.data.batching import pad_batch
from trl_ext.data.sequences import response_mask
from trl_ext.errors import InputError
from trl_ext.rollouts.base import Sampling
from trl_ext.rollouts.record import RolloutBatch


def given_rollouts(
    queries, responses, scores, sampling: Sampling, batch_size: int
) -> tuple[RolloutBatch, torch.Tensor]:
    """The record and the scores as a float32 tensor; one ``InputError`` for lists of other lengths than each other
    or ``batch_size``, or a score that is not finite."""
    if not (len(queries) == len(responses) == len(scores)):
        raise InputError(
            f"step needs as many queries, responses and scores (got {len(queries)}, {len(responses)}, {len(scores)})"
        )
    if len(queries) != batch_size:
        raise InputError(f"step expects batch_size={batch_size} rollouts, got {len(queries)}")
    device, tokenizer = sampling.device, sampling.tokenizer
    values = torch.as_tensor([float(s) for s in scores], dtype=torch.float32, device=device)
    if not torch.isfinite(values).all():
        raise InputError(f"non-finite score at index {int((~torch.isfinite(values)).nonzero()[0])}")
    query_ids, query_mask = sampling.pad(queries)
    response_ids, padding = pad_batch(responses, tokenizer.pad_token_id, side="right")
    response_ids = response_ids.to(device)
    # A response ends at its first eos or at its own length, whichever comes first.
    mask = response_mask(response_ids, tokenizer.eos_token_id) * padding.to(device)
    given = [list(r) for r in responses]
    batch = RolloutBatch(
        query_ids,
        query_mask,
        response_ids,
        loss_mask=mask,
        attention_mask=mask,
        prompts=[list(q) for q in queries],
        completions=given,
        completion_ids=given,
    )
    return batch, values
