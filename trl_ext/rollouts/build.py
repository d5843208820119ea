"""Which rollout a trainer runs: TRL's arguments (``tools``, ``environment_factory``, ``rollout_func``) where given,
else ``rollout``: a ``Rollout`` object, or a name in ``ROLLOUTS`` (``module:name`` user code included) whose class or
factory is called with no argument."""

from __future__ import annotations

from collections.abc import Callable

from trl_ext.errors import InputError
from trl_ext.rollouts.base import ROLLOUTS, Rollout
from trl_ext.rollouts.rollout_func import RolloutFunction
from trl_ext.rollouts.single_turn import SingleTurn
from trl_ext.rollouts.step_environment import StepEnvironment  # noqa: F401  registers 'step_environment'
from trl_ext.rollouts.tool_loop import ToolLoop

DEFAULT = "single_turn"


def build_rollout(
    rollout: Rollout | str | None = None,
    tools: list[Callable] | None = None,
    environment_factory: Callable | None = None,
    rollout_func: Callable | None = None,
) -> Rollout:
    agent = bool(tools) or environment_factory is not None
    if rollout_func is not None and agent:
        raise InputError(
            "rollout_func makes the whole rollout: give it alone, or tools / environment_factory "
            "without it (trl-ext does not run the tool loop after a rollout_func)"
        )
    if (agent or rollout_func is not None) and rollout not in (None, DEFAULT):
        raise InputError(
            f"rollout={rollout!r} and TRL's tools / environment_factory / rollout_func each make the "
            "rollout: give one of them"
        )
    if rollout_func is not None:
        return RolloutFunction(rollout_func)
    if agent:
        return ToolLoop(tools, environment_factory)
    if rollout is None or rollout == DEFAULT:
        return SingleTurn()
    if isinstance(rollout, Rollout):
        return rollout
    built = ROLLOUTS[rollout].fn()
    if not callable(getattr(built, "rollout", None)):
        raise InputError(
            f"rollout {rollout!r} made a {type(built).__name__}, which has no rollout(rows, sampling) "
            "method (subclass trl_ext.rollouts.Rollout)"
        )
    return built
