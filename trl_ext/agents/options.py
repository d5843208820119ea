"""The command line's multi-turn options (``rlhf --tools module:fn,... --environment module:Factory``) and loading
what they name."""

from __future__ import annotations

from dataclasses import dataclass

from trl_ext.agents.templates import TOOL_TEMPLATES
from trl_ext.errors import InputError
from trl_ext.settings.fields import field
from trl_ext.settings.user_code import import_callable


@dataclass
class AgentOptions:
    """Tools and an environment for multi-turn rollouts (TRL GRPOTrainer's ``tools`` and ``environment_factory``;
    docs/multi-turn.md)."""

    tools: str | None = field(
        None,
        help="tools the policy may call, as 'module:function' or 'file.py:function', "
        "comma-separated: plain functions with type hints and a docstring",
    )
    environment: str | None = field(
        None,
        help="an environment class or factory as 'module:Factory': one instance "
        "a rollout, reset(**row) per batch, its public methods are tools, get_reward() "
        "an optional reward",
    )
    tool_template: str | None = field(
        None,
        help="give the policy's tokenizer this tool chat template (for a model "
        "whose own template has no tool support, e.g. SmolLM2's ChatML)",
        choices=(*TOOL_TEMPLATES,),
    )

    def __post_init__(self):
        if self.tool_template is not None and self.tool_template not in TOOL_TEMPLATES:
            raise InputError(f"tool_template must be one of {', '.join(TOOL_TEMPLATES)}; got {self.tool_template!r}")

    @property
    def multi_turn(self) -> bool:
        return bool(self.tools or self.environment)


def load_agent(options: AgentOptions, policy: str) -> dict:
    """The trainer's keyword arguments: ``tools`` (a list) and ``environment_factory`` (or None).

    Checked here as the trainer checks them, so that a run refused for them writes nothing: each tool's schema,
    the environment (one instance made and dropped) and its methods' schemas, and the chat template of the
    ``policy`` directory's tokenizer (with ``--tool-template``), on a copy: the trainer prepares its own.
    """
    from trl_ext.agents.environments import EnvironmentPool
    from trl_ext.agents.templates import prepare_tokenizer, with_tool_template
    from trl_ext.agents.tools import check_tools
    from trl_ext.models.directory import load_tokenizer

    tools = [import_callable(s.strip(), "tool") for s in (options.tools or "").split(",") if s.strip()]
    factory = import_callable(options.environment, "environment") if options.environment else None
    check_tools(tools + (EnvironmentPool(factory).probe_tools() if factory is not None else []))
    tokenizer = load_tokenizer(policy, "policy")
    if options.tool_template:
        with_tool_template(tokenizer, options.tool_template)
    prepare_tokenizer(tokenizer)
    return {"tools": tools, "environment_factory": factory}
