"""Tools as TRL's GRPOTrainer takes them: plain functions with type hints and a docstring (their schema is what
the chat template shows the model), or the public methods of an environment. A tool call is executed as TRL
executes it: by name, with the parsed arguments as keywords; a tool that raises gives ``{"error": "..."}`` as
its result, and the model reads that.

A tool may return ``ToolResult(content, reward)``: ``content`` is what the model reads, ``reward`` a reward for
the turn that called it (trl-ext's addition: with a critic it lands on that turn's last token).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from trl_ext.errors import InputError

NOT_TOOLS = ("reset", "get_reward")  # an environment's methods that are no tools


@dataclass(frozen=True)
class ToolResult:
    """What a tool may return instead of plain content: the content and a reward for the turn that called it."""

    content: object
    reward: float = 0.0


@dataclass
class ToolCounts:
    """What one batch's tool calls did (summed over its rollouts)."""

    calls: int = 0  # tool calls executed (TRL's tools/call_frequency counts these)
    failures: int = 0  # calls that raised, named no known tool, or were no function call (TRL's failures)
    unknown: int = 0  # calls of a tool name not offered to the rollout (among the failures)
    malformed: int = 0  # assistant turns whose tool call could not be parsed: no call, the rollout ends
    overlong: int = 0  # tool results dropped because they would overflow response_length (the rollout ends)


def environment_tools(environment) -> list[Callable]:
    """An environment's tools: its public methods but ``reset`` and ``get_reward`` (listed on the class, as TRL
    does, so properties are not evaluated)."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), inspect.isfunction)
        if name not in NOT_TOOLS and not name.startswith("_")
    ]


def check_tools(tools: list) -> None:
    """Each tool a named callable, no name twice, none a coroutine function (not supported here), each one whose
    schema transformers can build (``check_tool_schema``)."""
    names = set()
    for tool in tools:
        name = getattr(tool, "__name__", None)
        if not callable(tool) or not name:
            raise InputError(f"tools holds {tool!r}: expected named functions")
        if inspect.iscoroutinefunction(tool):
            raise InputError(f"tool {name!r} is async: trl-ext calls tools synchronously; wrap it in a plain function")
        if name in names:
            raise InputError(f"two tools are named {name!r}: the model calls tools by name")
        names.add(name)
        check_tool_schema(tool, f"tool {name!r}")


def check_tool_schema(tool: Callable, label: str) -> None:
    """Build the tool's schema as the chat template will (transformers' ``get_json_schema``), so that a tool it
    cannot describe is refused in one line, ``label`` and what the tool lacks, not by a traceback at the first
    rollout."""
    from transformers.utils import DocstringParsingException, TypeHintParsingException, get_json_schema

    try:
        get_json_schema(tool)
    except DocstringParsingException as error:
        raise InputError(f"{label} {_docstring_lack(tool, error)}") from error
    except TypeHintParsingException as error:
        raise InputError(f"{label} {_type_hint_lack(tool, error)}") from error
    except NameError as error:  # a string annotation (``from __future__ import annotations``) that names nothing
        raise InputError(f"{label} has a type hint that cannot be resolved: {error}") from error


GOOGLE_ARGS = "a Google-style docstring: a summary, then 'Args:' with a line 'name: what it is' for each argument"


def _docstring_lack(tool: Callable, error: Exception) -> str:
    if not inspect.getdoc(tool):
        return f"has no docstring: the model sees a tool through its schema, built from {GOOGLE_ARGS}"
    undescribed = re.search(r"no description for the argument '(\w+)'", str(error))
    if undescribed:
        return (
            f"has no description of its argument {undescribed[1]!r} in its docstring: add '{undescribed[1]}: "
            "what it is' under 'Args:' (transformers requires one for every argument)"
        )
    return f"has a docstring transformers cannot read ({GOOGLE_ARGS}): {str(error).splitlines()[0]}"


def _type_hint_lack(tool: Callable, error: Exception) -> str:
    unhinted = [
        name
        for name, parameter in inspect.signature(tool).parameters.items()
        if parameter.annotation is inspect.Parameter.empty and name not in ("self", "cls")
    ]
    if unhinted:
        return (
            f"has no type hint on its argument {unhinted[0]!r}: the schema the model sees gives every "
            f"argument's type ('{unhinted[0]}: int', '{unhinted[0]}: str', ...)"
        )
    return f"has a type hint transformers cannot turn into a JSON schema: {str(error).splitlines()[0]}"


@dataclass
class Toolbox:
    """The tools one rollout may call, by name."""

    tools: list[Callable]
    by_name: dict[str, Callable] = field(init=False)

    def __post_init__(self):
        self.by_name = {tool.__name__: tool for tool in self.tools}

    def call(self, tool_call: dict, counts: ToolCounts) -> tuple[dict, float]:
        """Execute one parsed call -> ``(tool message, reward)``; faults become the result, and are counted."""
        counts.calls += 1
        if tool_call.get("type", "function") != "function":
            counts.failures += 1
            name = tool_call.get("name", "unknown")
            return _message(name, {"error": f"Unsupported tool call type: {tool_call.get('type')}"}), 0.0
        function = tool_call.get("function", tool_call)
        name, arguments = function["name"], function.get("arguments") or {}
        tool = self.by_name.get(name)
        if tool is None:
            counts.failures += 1
            counts.unknown += 1
            return _message(name, {"error": f"Tool {name} not found."}), 0.0
        try:
            result = tool(**arguments) if isinstance(arguments, dict) else tool(arguments)
        except Exception as error:  # the model reads the error, as in TRL
            counts.failures += 1
            return _message(name, {"error": str(error)}), 0.0
        if isinstance(result, ToolResult):
            return _message(name, result.content), float(result.reward)
        return _message(name, result), 0.0


def _message(name: str, content) -> dict:
    return {"role": "tool", "name": name, "content": content if isinstance(content, list) else str(content)}
