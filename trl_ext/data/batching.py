"""Padding token-id lists into tensors."""

from __future__ import annotations

import torch

from trl_ext.errors import InputError


def pad_batch(sequences: list[list[int]], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest sequence; returns ``(input_ids, attention_mask)``, both ``(B, T)`` long tensors."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    if not sequences or any(len(s) == 0 for s in sequences):
        raise InputError("cannot pad an empty batch or an empty sequence (every query and response needs a token)")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        span = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        if isinstance(seq, str) or isinstance(seq[0], str):
            raise _not_ids(row, seq, "text")
        try:
            ids[row, span] = torch.as_tensor(seq, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError):  # one line for the caller's data, not torch's
            raise _not_ids(row, seq, "not a list of token ids") from None
        mask[row, span] = 1
    return ids, mask


def _not_ids(row: int, seq, kind: str) -> InputError:
    return InputError(
        f"row {row}: {seq!r:.60} is {kind}: queries and responses are lists of token ids (tokenizer(text)['input_ids'])"
    )
