"""Fixed splits of a task's items (numbers, names): a held-out draw fixed for good by its seed, the training rest,
and the evaluation splits by name."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence


def held_out(items: Sequence, count: int, seed: int) -> list:
    """``count`` of ``items``, the first of a shuffle by ``seed`` (so the same ones for good), sorted."""
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    return sorted(shuffled[:count])


def rest(items: Sequence, held: Sequence) -> list:
    """``items`` not in ``held``, in their order."""
    left_out = set(held)
    return [item for item in items if item not in left_out]


def by_name(splits: dict[str, Callable[[], list]], split: str) -> list:
    """The evaluation split named ``split`` (``splits``: name -> what makes it); ValueError naming the known ones."""
    if split not in splits:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(splits)}")
    return splits[split]()
