"""Plain wrappers around reward functions: weighted sums, clipping."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

from trl_ext.rewards.base import RewardError, RewardFunction, call_reward, combine_rewards, reward_name


class WeightedSum(RewardFunction):
    """``sum_i w_i * f_i(prompts, completions, **columns)``; a function's ``None`` is left out of its
    row's sum (GRPO's rule), and a row where all are ``None`` is an error."""

    def __init__(self, functions: Sequence[Callable], weights: Sequence[float] | None = None, name: str | None = None):
        weights = [1.0] * len(functions) if weights is None else list(weights)
        if not functions or len(weights) != len(functions):
            raise RewardError(
                f"WeightedSum needs one weight per function (got {len(functions)} functions, {len(weights)} weights)"
            )
        if not all(isinstance(w, numbers.Real) and not isinstance(w, bool) for w in weights):
            raise RewardError(f"WeightedSum's weights must be numbers, got {weights!r}")
        self.functions, self.weights = list(functions), [float(w) for w in weights]
        self.name = name or "+".join(f"{w:g}*{reward_name(f)}" for f, w in zip(functions, weights))

    def score(self, prompts, completions, **columns):
        per_function = [call_reward(fn, prompts, completions, allow_none=True, **columns) for fn in self.functions]
        return combine_rewards(per_function, self.weights, [reward_name(f) for f in self.functions], prompts)


class Clipped(RewardFunction):
    """Clamp another reward into ``[low, high]``; its ``None`` ("does not apply") passes through unclamped, for
    the caller (``WeightedSum``, the trainer's scoring) to leave out as GRPO does."""

    allow_none = True

    def __init__(self, function: Callable, low: float = -math.inf, high: float = math.inf):
        if low > high:
            raise RewardError(f"Clipped: low {low} is above high {high}")
        self.function, self.low, self.high = function, low, high
        self.name = f"clipped_{reward_name(function)}"

    def score(self, prompts, completions, **columns):
        values = call_reward(self.function, prompts, completions, allow_none=True, **columns)
        return [None if v is None else min(self.high, max(self.low, v)) for v in values]
