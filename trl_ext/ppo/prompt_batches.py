"""The prompts of a run, batch after batch: read in order (a resumed run skips the batches it had used), each
prompt repeated ``num_generations`` times in a row (a group of completions per prompt), split over processes."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

from trl_ext.errors import InputError


def _collate(rows: list[dict], repeats: int = 1) -> dict:
    """Columns of ``rows``, each row repeated ``repeats`` times in a row."""
    rows = [row for row in rows for _ in range(repeats)]
    return {key: [row[key] for row in rows] for key in rows[0]}


def prompt_batches(dataset, config, accelerator, skip: int = 0) -> Iterator[dict]:
    """Endless batches of ``config.batch_size`` rows (columns as lists) from ``dataset``, the first ``skip`` left
    out."""
    from torch.utils.data import DataLoader

    loader = accelerator.prepare(
        DataLoader(
            dataset,
            batch_size=config.batch_size // config.num_generations,
            shuffle=False,
            drop_last=True,
            collate_fn=functools.partial(_collate, repeats=config.num_generations),
        )
    )
    if len(loader) == 0:
        raise InputError(f"train_dataset of {len(dataset)} rows is smaller than one batch")
    return itertools.islice(itertools.chain.from_iterable(itertools.repeat(loader)), skip, None)
