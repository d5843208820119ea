"""A ``step()`` environment (Gym's protocol, text in and text out) as the conversation's other side: the model's
turn is the action, the observation comes back as a user turn.

The protocol is Gym's (and GEM's): ``reset(**row) -> observation`` or ``(observation, info)``, the row's dataset
columns as keywords (a ``seed`` column picks the game); ``step(action) -> (observation, reward, terminated,
truncated, info)``. ``terminated``: the game is over (won, lost); ``truncated``: it was cut short (its own turn
limit, or here ``max_turns`` or the token budget), as Gym means them. Every step's reward is that turn's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl_ext.agents import templates
from trl_ext.agents.trajectory import Trajectory
from trl_ext.agents.turns import Answer
from trl_ext.errors import InputError

REWARD_MODES = ("turn", "final")  # a step's reward on its turn, or the episode's return as the score alone


class StepFailure(InputError):
    """An environment's ``reset`` or ``step`` raised or returned something else than Gym's shapes."""


def reset_observation(environment, row: dict) -> str:
    """``environment.reset(**row)``'s observation (text; an ``(observation, info)`` pair's first item)."""
    name = type(environment).__name__
    try:
        out = environment.reset(**row)
    except Exception as error:
        shown = {k: v for k, v in row.items()}
        raise StepFailure(f"{name}.reset failed on row {shown!r:.200}: {type(error).__name__}: {error}") from error
    observation = out[0] if isinstance(out, tuple) else out
    if observation is None:
        return ""
    if not isinstance(observation, str):
        raise StepFailure(f"{name}.reset returned a {type(observation).__name__} observation: expected text")
    return observation


def step_once(environment, action: str) -> tuple[str, float, bool, bool]:
    """``environment.step(action)`` as ``(observation, reward, terminated, truncated)``, checked."""
    name = type(environment).__name__
    try:
        out = environment.step(action)
    except Exception as error:
        raise StepFailure(f"{name}.step failed on {action!r:.100}: {type(error).__name__}: {error}") from error
    if not isinstance(out, tuple) or len(out) != 5:
        raise StepFailure(
            f"{name}.step returned {type(out).__name__}{f' of {len(out)}' if isinstance(out, tuple) else ''}: "
            "expected Gym's (observation, reward, terminated, truncated, info)"
        )
    observation, reward, terminated, truncated, _ = out
    if not isinstance(observation, str):
        raise StepFailure(f"{name}.step returned a {type(observation).__name__} observation: expected text")
    return observation, float(reward), bool(terminated), bool(truncated)


@dataclass
class StepSide:
    """One episode as the other side of a rollout: each model turn (decoded) is stepped; its reward is the turn's;
    the observation is the next user turn, until the episode terminates or is truncated (``max_turns`` steps, None:
    the environment's own limit)."""

    environment: Any
    max_turns: int | None = None
    rewards: list[float] = field(default_factory=list)  # each step's, in order
    terminated: bool = False
    truncated: bool = False

    def answer(self, tokenizer, ids: list[int], query: list[int], trajectory: Trajectory) -> Answer:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        message = {"role": "assistant", "content": text}
        observation, reward, self.terminated, truncated = step_once(self.environment, text)
        self.rewards.append(reward)
        self.truncated = truncated or (self.max_turns is not None and len(self.rewards) >= self.max_turns)
        if self.terminated or self.truncated:
            return Answer(message, reward)
        user = [{"role": "user", "content": observation}]
        return Answer(message, reward, user, templates.turn_suffix_ids(tokenizer, user))

    def dropped(self) -> None:
        self.truncated = True  # the observation did not fit the budget or the context

    @property
    def episode_return(self) -> float:
        return sum(self.rewards)
