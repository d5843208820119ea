"""Supervised stages of the doubling pipeline: pretrain the policy, train the reward classifier.

A plain loop rather than ``transformers.Trainer``: the models are tiny (a step is tens of
milliseconds), so Trainer's per-step overhead, output directories and logging integrations
cost more than the math; the loop below is all the behaviour we need, in one screen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from trl_ext.data.batching import pad_batch
from trl_ext.errors import InputError


@dataclass
class LoopResult:
    losses: list[float]
    seconds: float


def _check_rows(columns: dict, names: tuple[str, ...]) -> None:
    missing = [c for c in names if c not in columns]
    if missing:
        raise InputError(f"dataset is missing column(s) {missing}; it has {sorted(columns)}")
    for index, ids in enumerate(columns["input_ids"]):
        if not ids:
            raise InputError(f"dataset row {index} has empty input_ids")


def _items(rows: list[list[int]], use_labels: bool) -> int:
    """What the model's loss averages over: rows (classification) or predicted tokens (next-token loss)."""
    return len(rows) if use_labels else sum(len(ids) - 1 for ids in rows)


def _join_group(parameters: list[torch.Tensor], rank: int, world_size: int) -> None:
    """Check that this process is ``rank`` of a ``world_size`` group, and start from rank 0's weights (as DDP
    does: equal seeds build equal models, but a rank that built another would otherwise go unnoticed)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise InputError(f"world_size {world_size} needs an initialised torch.distributed process group")
    if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
        raise InputError(
            f"rank {rank} of world_size {world_size} given, but this process is rank "
            f"{dist.get_rank()} of {dist.get_world_size()}"
        )
    for p in parameters:
        dist.broadcast(p.data, src=0)


def _sum_gradients(parameters: list[torch.Tensor], loss: torch.Tensor) -> torch.Tensor:
    """All-reduce (sum) every gradient and ``loss`` over the process group in one flat message; the summed loss."""
    import torch.distributed as dist

    for p in parameters:
        # Unused this step here, maybe not on another rank: every rank sends the same layout. (A parameter no rank
        # used then steps on a zero gradient where one process would skip it: no model here has one.)
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in parameters] + [loss.detach().reshape(1)])
    dist.all_reduce(flat)
    offset = 0
    for p in parameters:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
        offset += p.numel()
    return flat[-1]


def supervised_loop(
    model,
    dataset,
    pad_id: int,
    *,
    batch_size: int,
    lr: float,
    warmup_steps: int,
    use_labels: bool,
    seed: int,
    desc: str,
    show_progress: bool = True,
    rank: int = 0,
    world_size: int = 1,
) -> LoopResult:
    """One pass over ``dataset`` in order, ``batch_size`` rows a step, AdamW + warmup + cosine.

    ``use_labels=False``: next-token loss on real tokens (padding ignored, labels = -100).
    ``use_labels=True``: sequence classification on the ``label`` column.
    ``world_size > 1``: data parallel over an initialised ``torch.distributed`` group: each rank runs its share
    of every batch, its loss weighted by its share of the batch's items, and the gradients are summed, so a
    step follows the whole batch's mean loss as one process would (up to float rounding; the dropout masks
    are each rank's own).
    """
    import time

    if not 0 <= rank < world_size <= batch_size:
        raise InputError(
            f"rank {rank} of world_size {world_size} with batch_size {batch_size}: need "
            "0 <= rank < world_size <= batch_size"
        )
    columns = dataset[:]  # every row as Python lists at once: reading the dataset per step cost a tenth of it
    _check_rows(columns, ("input_ids", "label") if use_labels else ("input_ids",))
    steps = len(dataset) // batch_size
    if steps == 0:
        raise InputError(f"dataset of {len(dataset)} rows is smaller than one batch of {batch_size}")
    torch.manual_seed(seed + rank)
    model.train()
    parameters = [p for p in model.parameters() if p.requires_grad]
    if world_size > 1:
        _join_group(parameters, rank, world_size)
    # foreach: one kernel per op over all parameters, not one per parameter (the same numbers, bit for bit)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    schedule = get_cosine_schedule_with_warmup(optimizer, min(warmup_steps, steps // 2), steps)
    losses = []
    start = time.perf_counter()
    bar = tqdm(range(steps), desc=desc, disable=None if show_progress else True, leave=False, mininterval=1.0)
    for step in bar:
        first = step * batch_size
        share = slice(first + rank * batch_size // world_size, first + (rank + 1) * batch_size // world_size)
        input_ids, attention_mask = pad_batch(columns["input_ids"][share], pad_id, side="right")
        if use_labels:
            labels = torch.as_tensor(columns["label"][share], dtype=torch.long)
        else:
            labels = input_ids.masked_fill(attention_mask == 0, -100)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        if world_size == 1:
            loss.backward()
        else:
            batch = columns["input_ids"][first : first + batch_size]
            loss = loss * (_items(columns["input_ids"][share], use_labels) / _items(batch, use_labels))
            loss.backward()
            loss = _sum_gradients(parameters, loss)
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 20 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    model.eval()
    return LoopResult(losses, time.perf_counter() - start)
