"""Padding-free passes (``padding_free``): a batch's sequences, each row's real tokens (attention mask 1), packed
end to end into a few rows, position ids restarting at each sequence, and a 4D block-diagonal causal mask keeping
each token's attention within its own sequence (transformers' sdpa and eager attention read it as given; flash
attention would read the packed rows from ``position_ids`` alone, not run here). What a pass computes is read back
per sequence into the padded ``(B, P + R)`` / ``(B, R)`` layout the rest of the trainer uses, 0 on padding.

A packed row is at most as long as the padded rows (``P + R``), so no row attends over more positions than a padded
row does; sequences go to rows first-fit by decreasing length. The LM head runs at the positions that predict a
next token in any packed row (one index set for all rows, as transformers' ``logits_to_keep`` takes it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trl_ext.errors import InputError

# transformers' attention implementations that apply a 4D float attention mask as given.
MASKED_ATTENTION = ("sdpa", "eager")


def check_padding_free(models, num_processes: int = 1) -> None:
    """One line naming what stops ``padding_free`` for these models (the policy, a reference, a critic's own
    backbone), else nothing."""
    for model in models:
        implementation = getattr(model.config, "_attn_implementation", None)
        if implementation not in MASKED_ATTENTION:
            raise InputError(
                f"padding_free keeps packed sequences apart with a 4D block-diagonal attention mask, which "
                f"transformers' {' and '.join(MASKED_ATTENTION)} attention apply; {type(model).__name__} runs "
                f"{implementation!r} attention (flash attention reads packed rows from position_ids, untested here; "
                "flex attention and others are unchecked): load it with attn_implementation='sdpa' or leave "
                "padding_free off"
            )


def token_parts(lengths: torch.Tensor, budget: int) -> list[slice]:
    """Consecutive rows whose ``lengths`` (real tokens) sum to at most ``budget`` each (a row longer alone)."""
    parts, start, total = [], 0, 0
    for i, length in enumerate(lengths.tolist()):
        if i > start and total + length > budget:
            parts.append(slice(start, i))
            start, total = i, 0
        total += length
    parts.append(slice(start, len(lengths)))
    return parts


def _first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows of at most ``capacity`` tokens, each a list of sequence indices: first fit, longest first."""
    rows: list[list[int]] = []
    room: list[int] = []
    for seq in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, free in enumerate(room) if free >= lengths[seq]), None)
        if row is None:
            rows.append([])
            room.append(capacity)
            row = len(rows) - 1
        rows[row].append(seq)
        room[row] -= lengths[seq]
    return rows


@dataclass
class PackedBatch:
    """A padded batch's real tokens packed into rows, and the maps back."""

    input_ids: torch.Tensor  # (N, L) the sequences end to end, pad (0) at the end of a row
    attention_mask: torch.Tensor  # (N, 1, L, L) 0 where a token may attend (its own sequence, causal), dtype min else
    position_ids: torch.Tensor  # (N, L) the padded rows' own positions, restarting with each sequence
    keep: torch.Tensor  # (K + 1,) positions predicting a next token in some row, and one more (dropped, as
    # ``ForwardPasses.kept_positions``'s last)
    tokens: torch.Tensor  # (N, K) the next token at each of ``keep[:-1]``
    packed_index: torch.Tensor  # (M,) flat index (row * L + column) of each real token in the packed rows
    padded_index: torch.Tensor  # (M,) its flat index in the padded rows
    padded_mask: torch.Tensor  # (B, P + R) the padded rows' attention mask

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.input_ids, self.attention_mask, self.position_ids

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """A per-position ``(N, L)`` tensor (values) in the padded layout ``(B, P + R)``, 0 on padding."""
        flat = x.new_zeros(self.padded_mask.numel())
        flat = flat.index_copy(0, self.padded_index, x.reshape(-1).index_select(0, self.packed_index))
        return flat.reshape(self.padded_mask.shape)

    def responses(self, x: torch.Tensor, response_length: int) -> torch.Tensor:
        """A per-kept-position ``(N, K)`` tensor (log-probs, entropy: each of the next token) at the last
        ``response_length`` tokens of the padded rows ``(B, R)``, 0 on padding."""
        rows, length = self.input_ids.shape
        full = x.new_zeros(rows, length).index_copy(1, self.keep[:-1], x)
        padded = self.unpack(full)[:, -response_length - 1 : -1]
        return padded * self.padded_mask[:, -response_length:].to(padded.dtype)


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    dtype: torch.dtype,
) -> PackedBatch:
    """Pack the real tokens of padded rows ``(B, P + R)`` into rows of at most ``P + R`` tokens; the 4D mask in
    ``dtype`` (the model's)."""
    batch, width = input_ids.shape
    device = input_ids.device
    real = attention_mask.bool()
    lengths = real.sum(1).tolist()
    if min(lengths, default=0) == 0:
        raise InputError("padding_free: a row with no real tokens (attention_mask all 0) cannot be packed")
    rows = _first_fit(lengths, width)
    length = max(sum(lengths[s] for s in row) for row in rows)
    # per real token: its sequence, its padded (b, t) and its packed (n, l) coordinates
    padded_b, padded_t = real.nonzero(as_tuple=True)  # row-major: each sequence's tokens in order
    starts = torch.tensor([0, *lengths], device=device).cumsum(0)
    offsets, packed_rows = [0] * batch, [0] * batch
    for n, row in enumerate(rows):
        column = 0
        for seq in row:
            offsets[seq], packed_rows[seq] = column, n
            column += lengths[seq]
    token_in_seq = torch.arange(len(padded_b), device=device) - starts[padded_b]
    packed_n = torch.tensor(packed_rows, device=device)[padded_b]
    packed_l = torch.tensor(offsets, device=device)[padded_b] + token_in_seq
    packed_index = packed_n * length + packed_l
    padded_index = padded_b * width + padded_t

    def scatter(values: torch.Tensor, fill: int) -> torch.Tensor:
        flat = values.new_full((len(rows) * length,), fill)
        return flat.index_copy(0, packed_index, values[padded_b, padded_t]).reshape(len(rows), length)

    packed_ids = scatter(input_ids, 0)
    packed_positions = scatter(position_ids, 0)
    # each padding position its own sequence: it attends to itself alone (no row of the mask is all dtype min)
    padding_ids = -1 - torch.arange(len(rows) * length, device=device).reshape(len(rows), length)
    sequence = padding_ids.reshape(-1).index_copy(0, packed_index, padded_b).reshape(len(rows), length)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    allowed = (sequence[:, :, None] == sequence[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    # a position predicts a next token of its own sequence unless it is its sequence's last
    predicts = torch.zeros(len(rows) * length, dtype=torch.bool, device=device)
    predicts[packed_index[token_in_seq < torch.tensor(lengths, device=device)[padded_b] - 1]] = True
    kept = predicts.reshape(len(rows), length).any(0).nonzero().squeeze(1)
    keep = torch.cat([kept, torch.tensor([length - 1], device=device)])
    tokens = packed_ids[:, kept + 1]  # a predicting position's next is in its row
    return PackedBatch(
        packed_ids,
        mask[:, None],
        packed_positions,
        keep,
        tokens,
        packed_index,
        padded_index,
        attention_mask,
    )
