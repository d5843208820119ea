"""The reward-function protocol shared by TRL's GRPO/RLOO, our PPO adapter and the in-house trainer.

A reward function is any callable ``fn(prompts, completions, **columns) -> list[float]``
with a ``__name__`` (TRL's ``reward_funcs`` convention). ``call_reward`` is the one place
that calls such a function and checks what comes back.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence


class RewardError(ValueError):
    """A reward function was called with bad input or returned bad values."""


def reward_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def check_inputs(name: str, prompts: Sequence[str], completions: Sequence[str], columns: dict) -> None:
    if len(prompts) != len(completions):
        raise RewardError(f"reward {name!r}: {len(prompts)} prompts but {len(completions)} completions")
    for column, values in columns.items():
        if isinstance(values, (list, tuple)) and len(values) != len(prompts):
            raise RewardError(f"reward {name!r}: column {column!r} has {len(values)} values for {len(prompts)} prompts")


def validate_rewards(name: str, values, expected: int, allow_none: bool = False) -> list:
    """Return ``values`` as a list of floats; raise naming ``name`` and the first bad index."""
    if hasattr(values, "tolist"):  # torch tensors and numpy arrays
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise RewardError(f"reward {name!r} returned a {type(values).__name__}, expected a list of floats")
    if len(values) != expected:
        raise RewardError(f"reward {name!r} returned {len(values)} values for {expected} completions")
    out = []
    for index, value in enumerate(values):
        if value is None and allow_none:
            out.append(None)
            continue
        if value is None or isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RewardError(f"reward {name!r} returned a non-number {value!r} at index {index}")
        if not math.isfinite(value):
            raise RewardError(f"reward {name!r} returned {value} at index {index}")
        out.append(float(value))
    return out


def call_reward(fn: Callable, prompts: Sequence[str], completions: Sequence[str], **columns) -> list[float]:
    """Call any reward function and insist on one finite float per completion (None is an error here)."""
    name = reward_name(fn)
    check_inputs(name, prompts, completions, columns)
    return validate_rewards(name, fn(list(prompts), list(completions), **columns), len(prompts))


class RewardFunction:
    """Base for picklable reward callables: subclasses implement ``score``; ``__call__`` checks it."""

    allow_none = False

    @property
    def __name__(self) -> str:  # noqa: A003 - TRL reads reward_func.__name__
        return getattr(self, "name", None) or type(self).__name__

    def score(self, prompts: list[str], completions: list[str], **columns) -> list:
        raise NotImplementedError

    def __call__(self, prompts, completions, **columns) -> list:
        check_inputs(self.__name__, prompts, completions, columns)
        values = self.score(list(prompts), list(completions), **columns)
        return validate_rewards(self.__name__, values, len(prompts), allow_none=self.allow_none)


def require_column(name: str, columns: dict, column: str) -> list:
    if column not in columns or columns[column] is None:
        raise RewardError(f"reward {name!r} needs the dataset column {column!r}; got columns {sorted(columns)}")
    return list(columns[column])
