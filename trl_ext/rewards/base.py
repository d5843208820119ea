"""The reward-function protocol shared by TRL's GRPO/RLOO, our PPO adapter and the scratch trainer.

A reward function is any callable ``fn(prompts=..., completions=..., **kwargs) -> list[float]``
with a ``__name__`` (TRL's ``reward_funcs`` convention: called by keyword, extra keyword
arguments such as ``completion_ids``, ``trainer_state`` and the dataset's other columns;
``None`` where a function does not apply to a row). ``call_reward`` is the one place that
calls such a function and checks what comes back; ``combine_rewards`` the one place that
adds several up, by GRPO's rule.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

from trl_ext.errors import InputError


class RewardError(InputError):
    """A reward function was called with bad input or returned bad values."""


def reward_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def check_signature(fn: Callable, where: str | None = None) -> None:
    """A reward function is called by keyword with every column (TRL's convention): refuse, before any run, one
    that could not take them (no ``**kwargs``), naming its parameters."""
    import inspect

    target = fn
    if inspect.isclass(fn):  # a class --reward-fn names is built first: its instances' __call__ is what TRL calls
        target = inspect.getattr_static(fn, "__call__", None)
        if not inspect.isfunction(target):
            return
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read, the call will tell
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    name = where or reward_name(fn)
    given = ", ".join(p.name for p in parameters)
    raise RewardError(
        f"reward function {name!r} takes ({given}): reward functions are called by keyword as TRL's GRPO calls "
        "them (prompts=, completions=, completion_ids=, trainer_state=, and the dataset's columns), so give it "
        f"**kwargs: def {'__call__' if target is not fn else reward_name(fn)}({given + ', ' if given else ''}**kwargs)"
    )


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


def call_reward(fn: Callable, prompts: Sequence, completions: Sequence, allow_none: bool = False, **columns) -> list:
    """Call any reward function by keyword, as TRL's GRPO does, and insist on one finite float per
    completion (or ``None`` where ``allow_none``)."""
    name = reward_name(fn)
    check_inputs(name, prompts, completions, columns)
    values = fn(prompts=list(prompts), completions=list(completions), **columns)
    return validate_rewards(name, values, len(prompts), allow_none=allow_none)


def combine_rewards(
    per_function: Sequence[Sequence[float | None]],
    weights: Sequence[float],
    names: Sequence[str],
    prompts: Sequence | None = None,
) -> list[float]:
    """GRPO's rule: per row, the weighted sum over the functions that did not return ``None``.

    A row where every function returned ``None`` has no reward at all: that is an error naming the row.
    """
    if len(weights) != len(per_function):
        raise RewardError(f"{len(weights)} reward weights for {len(per_function)} reward functions")
    rows = len(per_function[0]) if per_function else 0
    totals = []
    for row in range(rows):
        values = [(w, f[row]) for f, w in zip(per_function, weights) if f[row] is not None]
        if not values:
            where = f" (prompt {prompts[row]!r})" if prompts is not None else ""
            raise RewardError(
                f"every reward function ({', '.join(names)}) returned None for row {row}{where}: "
                "at least one must score each completion"
            )
        totals.append(sum(w * v for w, v in values))
    return totals


class RewardFunction:
    """Base for picklable reward callables: subclasses implement ``score``; ``__call__`` checks it.

    ``allow_none``: the function may return ``None`` for rows it does not apply to.
    """

    allow_none = False

    @property
    def __name__(self) -> str:  # noqa: A003 - TRL reads reward_func.__name__
        return getattr(self, "name", None) or type(self).__name__

    def score(self, prompts: list, completions: list, **columns) -> list:
        raise NotImplementedError

    def __call__(self, prompts, completions, **columns) -> list:
        check_inputs(self.__name__, prompts, completions, columns)
        values = self.score(list(prompts), list(completions), **columns)
        return validate_rewards(self.__name__, values, len(prompts), allow_none=self.allow_none)


def import_reward_function(spec: str) -> Callable:
    """``"package.module:function"`` or ``"path/to/file.py:function"`` -> that callable (``--reward-fn``)."""
    from trl_ext.settings.user_code import import_callable

    fn = import_callable(spec, "reward function", RewardError)
    check_signature(fn, spec)
    return fn


def place_reward(fn: Callable, device) -> None:
    """Move a reward function's model (``ClassifierReward.to``) to ``device``, where the trainer runs.

    TRL moves ``nn.Module`` reward models itself; a model held inside a reward *function* it never sees.
    """
    import torch.nn

    if hasattr(fn, "to") and not isinstance(fn, torch.nn.Module):
        fn.to(device)


def require_column(name: str, columns: dict, column: str) -> list:
    if column not in columns or columns[column] is None:
        raise RewardError(f"reward {name!r} needs the dataset column {column!r}; got columns {sorted(columns)}")
    return list(columns[column])
