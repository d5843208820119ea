"""The command line's multi-turn options (``rlhf --tools module:fn,... --environment module:Factory``) and loading
what they name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trl_ext.agents.templates import TOOL_TEMPLATES
from trl_ext.errors import InputError
from trl_ext.settings.fields import field


@dataclass
class AgentOptions:
    """Tools and an environment for multi-turn rollouts (TRL GRPOTrainer's ``tools`` and ``environment_factory``;
    docs/multi-turn.md)."""

    tools: str | None = field(None, help="tools the policy may call, as 'module:function' or 'file.py:function', "
                              "comma-separated: plain functions with type hints and a docstring")
    environment: str | None = field(None, help="an environment class or factory as 'module:Factory': one instance "
                                    "a rollout, reset(**row) per batch, its public methods are tools, get_reward() "
                                    "an optional reward")
    tool_template: str | None = field(None, help="give the policy's tokenizer this tool chat template (for a model "
                                      "whose own template has no tool support, e.g. SmolLM2's ChatML)",
                                      choices=(*TOOL_TEMPLATES,))

    def __post_init__(self):
        if self.tool_template is not None and self.tool_template not in TOOL_TEMPLATES:
            raise InputError(f"tool_template must be one of {', '.join(TOOL_TEMPLATES)}; got {self.tool_template!r}")

    @property
    def multi_turn(self) -> bool:
        return bool(self.tools or self.environment)


def import_object(spec: str, what: str) -> Callable:
    """``"package.module:name"`` or ``"path/to/file.py:name"`` -> that callable; errors name ``what`` and ``spec``."""
    from trl_ext.rewards.base import RewardError, import_reward_function

    try:
        return import_reward_function(spec)
    except RewardError as error:
        raise InputError(str(error).replace("reward function", what, 1)) from None


def load_agent(options: AgentOptions) -> dict:
    """The trainer's keyword arguments: ``tools`` (a list) and ``environment_factory`` (or None)."""
    tools = [import_object(s.strip(), "tool") for s in (options.tools or "").split(",") if s.strip()]
    factory = import_object(options.environment, "environment") if options.environment else None
    return {"tools": tools, "environment_factory": factory}
