"""Plain wrappers around reward functions: weighted sums, clipping, running normalisation."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from trl_ext.rewards.base import RewardError, RewardFunction, call_reward, combine_rewards, reward_name


class WeightedSum(RewardFunction):
    """``sum_i w_i * f_i(prompts, completions, **columns)``; a function's ``None`` is left out of its
    row's sum (GRPO's rule), and a row where all are ``None`` is an error."""

    def __init__(self, functions: Sequence[Callable], weights: Sequence[float] | None = None, name: str | None = None):
        weights = [1.0] * len(functions) if weights is None else list(weights)
        if not functions or len(weights) != len(functions):
            raise RewardError(f"WeightedSum needs one weight per function (got {len(functions)} functions, "
                              f"{len(weights)} weights)")
        self.functions, self.weights = list(functions), weights
        self.name = name or "+".join(f"{w:g}*{reward_name(f)}" for f, w in zip(functions, weights))

    def score(self, prompts, completions, **columns):
        per_function = [call_reward(fn, prompts, completions, allow_none=True, **columns) for fn in self.functions]
        return combine_rewards(per_function, self.weights, [reward_name(f) for f in self.functions], prompts)


class Clipped(RewardFunction):
    """Clamp another reward into ``[low, high]``."""

    def __init__(self, function: Callable, low: float = -math.inf, high: float = math.inf):
        if low > high:
            raise RewardError(f"Clipped: low {low} is above high {high}")
        self.function, self.low, self.high = function, low, high
        self.name = f"clipped_{reward_name(function)}"

    def score(self, prompts, completions, **columns):
        return [min(self.high, max(self.low, v)) for v in call_reward(self.function, prompts, completions, **columns)]


class RunningNormalized(RewardFunction):
    """``(r - mean) / std`` with mean and std running over every reward seen so far (this batch included)."""

    def __init__(self, function: Callable, eps: float = 1e-8):
        self.function, self.eps = function, eps
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.name = f"normalized_{reward_name(function)}"

    def update(self, values: list[float]) -> None:
        for value in values:  # Welford's online update
            self.count += 1
            delta = value - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (value - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count > 1 else 1.0

    def score(self, prompts, completions, **columns):
        values = call_reward(self.function, prompts, completions, **columns)
        self.update(values)
        return [(v - self.mean) / (self.std + self.eps) for v in values]
