"""Loading what the command line's multi-turn options name (``trl_ext.agents.options``): the tools, the
environment, or a public game's ``step_environment`` rollout, checked before anything is written."""

from __future__ import annotations

from trl_ext.agents.options import AgentOptions
from trl_ext.settings.user_code import import_callable


def load_agent(options: AgentOptions, policy: str) -> dict:
    """The trainer's keyword arguments: ``tools`` (a list) and ``environment_factory`` (or None); for a public
    environment, ``rollout``: the ``step_environment`` rollout playing it (checked here: its name, that it runs
    offline, a game made and reset, the policy's template rendering a user turn as a suffix).

    Checked here as the trainer checks them, so that a run refused for them writes nothing: each tool's schema,
    the environment (one instance made and dropped) and its methods' schemas, and the chat template of the
    ``policy`` directory's tokenizer (with ``--tool-template``), on a copy: the trainer prepares its own.
    """
    from trl_ext.agents.environments import EnvironmentPool
    from trl_ext.agents.templates import prepare_tokenizer, with_tool_template
    from trl_ext.agents.tools import check_tools
    from trl_ext.models.directory import load_tokenizer

    if options.public_environment:
        return {"rollout": public_rollout(options, load_tokenizer(policy, "policy"))}
    tools = [import_callable(s.strip(), "tool") for s in (options.tools or "").split(",") if s.strip()]
    factory = import_callable(options.environment, "environment") if options.environment else None
    check_tools(tools + (EnvironmentPool(factory).probe_tools() if factory is not None else []))
    tokenizer = load_tokenizer(policy, "policy")
    if options.tool_template:
        with_tool_template(tokenizer, options.tool_template)
    prepare_tokenizer(tokenizer)
    return {"tools": tools, "environment_factory": factory}


def public_rollout(options: AgentOptions, tokenizer):
    """The ``step_environment`` rollout of ``--environment gem:NAME`` / ``textarena:NAME`` and its options."""
    from trl_ext.agents.public_environments import environment_factory
    from trl_ext.agents.templates import turn_suffix_ids
    from trl_ext.rollouts.step_environment import StepEnvironment

    assert options.environment is not None
    factory = environment_factory(options.environment)
    turn_suffix_ids(tokenizer, [{"role": "user", "content": "probe"}])  # raises where a user turn is not a suffix
    return StepEnvironment(factory, options.environment_turns, options.turn_tokens, options.environment_rewards)
