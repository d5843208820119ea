"""Environments as TRL's GRPOTrainer takes them: ``environment_factory()`` makes one; one instance serves one
rollout at a time (instances are made once and reset for each batch). ``reset(**row)`` receives the dataset row
and may return text, appended to the prompt's last message; the public methods are the rollout's tools; an
optional ``get_reward()`` (no argument) scores the rollout from the environment's state, as one more reward
function (weight 1, named after the class)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from trl_ext.agents.tools import check_tool_schema, environment_tools
from trl_ext.errors import InputError


class EnvironmentFailure(InputError):
    """An environment could not be made or reset; the message names the row."""


class EnvironmentPool:
    def __init__(self, factory: Callable):
        if not callable(factory):
            raise InputError(f"environment_factory must be a callable that makes an environment, got {factory!r}")
        self.factory = factory
        probe = self._make()
        if not callable(getattr(probe, "reset", None)):
            raise InputError(
                f"the environment {type(probe).__name__} has no reset method (TRL's environments need one)"
            )
        self.env_type = type(probe)
        self.has_reward = callable(getattr(probe, "get_reward", None))
        if self.has_reward and inspect.iscoroutinefunction(probe.get_reward):
            raise InputError(f"{self.env_type.__name__}.get_reward is async: trl-ext calls it synchronously")
        self.instances = [probe]

    def _make(self):
        try:
            return self.factory()
        except Exception as error:
            raise EnvironmentFailure(f"environment_factory failed: {type(error).__name__}: {error}") from error

    def probe_tools(self) -> list[Callable]:
        """The tools of one environment (their schemas go in every prompt), each checked as a method of its class
        (the errors name ``Class.method``)."""
        tools = environment_tools(self.instances[0])
        for tool in tools:
            check_tool_schema(tool, f"environment method '{self.env_type.__name__}.{tool.__name__}'")
        return tools

    def take(self, count: int) -> list:
        """``count`` instances, one per rollout of a batch (made as needed, reused across batches)."""
        while len(self.instances) < count:
            self.instances.append(self._make())
        return self.instances[:count]

    @staticmethod
    def reset(environments: list, rows: list[dict], prompts: list[list[dict]]) -> list[list[dict]]:
        """Reset each environment with its row; text it returns is appended to the prompt's last message (a new
        list: the dataset's rows are left untouched). A reset that raises stops with the row named."""
        out = []
        for index, (environment, row, prompt) in enumerate(zip(environments, rows, prompts)):
            try:
                observation = environment.reset(**row)
            except Exception as error:
                shown = {k: v for k, v in row.items() if k != "input_ids"}
                raise EnvironmentFailure(
                    f"{type(environment).__name__}.reset failed on batch row {index} "
                    f"({shown!r:.200}): {type(error).__name__}: {error}"
                ) from error
            if observation is None:
                out.append(prompt)
                continue
            if not isinstance(observation, str):
                raise EnvironmentFailure(
                    f"{type(environment).__name__}.reset returned a {type(observation).__name__} "
                    f"on batch row {index}: expected text or None"
                )
            out.append(prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + observation}])
        return out

    def reward_function(self) -> Callable:
        """``get_reward`` as a reward function: it reads the ``environments`` keyword, as TRL's does."""
        env_type = self.env_type

        def get_reward(environments=None, **_):
            return [e.get_reward() if type(e) is env_type else None for e in environments]

        get_reward.__name__ = env_type.__name__
        return get_reward
