"""The chat template's side of a multi-turn rollout: whether it can render tool calls, how an assistant turn is
parsed into a message with ``tool_calls`` (TRL's response templates for the families it knows), and the tokens a
tool message adds after the assistant turn, so that each turn is appended to the ids already sampled and no
earlier turn is ever re-tokenized.

A template without tool support (SmolLM2-135M-Instruct's plain ChatML) can be given one, chosen by the user by
name (``with_tool_template``): never silently.
"""

from __future__ import annotations

import json
from pathlib import Path

from trl_ext.errors import InputError

# Tool templates TRL bundles (``trl/chat_templates/``), offered by name. TRL recognises a template for tool-call
# parsing only when it is byte-identical to its copy, so the file is read from the installed TRL, not rewritten.
TOOL_TEMPLATES = {"qwen2_5": "qwen2_5.jinja"}


class ChatTemplateError(InputError):
    """The chat template cannot render a multi-turn tool conversation as trl-ext trains it."""


def tool_template(name: str) -> str:
    """The text of the tool template ``name`` (``TOOL_TEMPLATES``), from the installed TRL."""
    import trl

    if name not in TOOL_TEMPLATES:
        raise InputError(f"unknown tool template {name!r}; known: {', '.join(TOOL_TEMPLATES)}")
    return (Path(trl.__file__).parent / "chat_templates" / TOOL_TEMPLATES[name]).read_text()


def with_tool_template(tokenizer, name: str):
    """Give ``tokenizer`` the tool template ``name`` (for a model whose own template has no tool support, e.g.
    SmolLM2's ChatML with Qwen2.5's template, which speaks ChatML with ``<tool_call>``); returns it."""
    tokenizer.chat_template = tool_template(name)
    return tokenizer


def _name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__


def supports_tools(tokenizer) -> bool:
    """Whether the template renders a whole tool exchange: the call's name and arguments and the tool's result
    (as TRL's ``supports_tool_calling`` checks: some templates drop one side silently)."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    call = {"type": "function", "function": {"name": "probe_tool_name", "arguments": {"probe_key": "probe_value"}}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "probe_tool_name", "content": "probe_result"},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that rejects the roles (jinja's TemplateError and its kin)
        return False
    return all(s in text for s in ("probe_tool_name", "probe_key", "probe_value", "probe_result"))


def prepare_tokenizer(tokenizer) -> None:
    """Check the template renders tools and give the tokenizer a response parser, or raise one clear error.

    The parser is the tokenizer's own ``response_template`` (or legacy ``response_schema``) where it has one,
    else TRL's for the template families TRL knows (``trl.chat_template_utils.add_response_schema``).
    """
    if not supports_tools(tokenizer):
        raise ChatTemplateError(
            f"the chat template of {_name(tokenizer)!r} cannot render tool calls and tool results; give it a tool "
            f"template explicitly (trl_ext.agents.with_tool_template(tokenizer, NAME), NAME one of "
            f"{', '.join(TOOL_TEMPLATES)}; the rlhf command's --tool-template)"
        )
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        from trl.chat_template_utils import add_response_schema

        try:
            add_response_schema(tokenizer)
        except ValueError as error:
            raise ChatTemplateError(
                f"no parser for the tool calls of {_name(tokenizer)!r}'s chat template: TRL parses only the template "
                f"families it bundles; set tokenizer.response_template, or use a tool template "
                f"({', '.join(TOOL_TEMPLATES)})"
            ) from error
    tool_suffix_ids(tokenizer, [{"role": "tool", "name": "probe", "content": "probe"}])  # raises where not a suffix


def tool_suffix_ids(tokenizer, tool_messages: list[dict]) -> list[int]:
    """The tokens the template renders for ``tool_messages`` after an assistant turn that ended with eos, up to
    and including the next assistant turn's header (``turn_suffix_ids`` after a turn that called the tool)."""
    call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
    return turn_suffix_ids(tokenizer, tool_messages, {"role": "assistant", "content": "", "tool_calls": [call]})


def turn_suffix_ids(tokenizer, messages: list[dict], assistant: dict | None = None) -> list[int]:
    """The tokens the template renders for ``messages`` (tool results, an environment's user turn) after the
    assistant turn ``assistant`` (default: plain text) ended with eos, up to and including the next assistant
    turn's header.

    Found as TRL finds it: a short conversation rendered with and without the messages, the shorter cut after its
    last eos. Where the longer is not the shorter plus a suffix, the template rewrites earlier turns when a message
    follows them, and appending tokens turn by turn would train on ids the template would not produce: that is an
    error, not a fallback.
    """
    head = [{"role": "user", "content": "dummy"}, assistant or {"role": "assistant", "content": "dummy"}]
    before = _ids(tokenizer.apply_chat_template(head, add_generation_prompt=False, tokenize=True))
    after = _ids(tokenizer.apply_chat_template(head + messages, add_generation_prompt=True, tokenize=True))
    eos = [i for i, token in enumerate(before) if token == tokenizer.eos_token_id]
    if eos:  # the assistant turn as sampled ends at eos; a template's newline after it belongs to the suffix
        before = before[: eos[-1] + 1]
    if after[: len(before)] != before:
        raise ChatTemplateError(
            f"the chat template of {_name(tokenizer)!r} does not render a {messages[0]['role']} turn as a pure suffix "
            "of the conversation so far (it rewrites earlier turns), so multi-turn ids cannot be built turn by turn; "
            f"use a prefix-preserving template ({', '.join(TOOL_TEMPLATES)})"
        )
    return after[len(before) :]


def _ids(rendered) -> list[int]:
    """``apply_chat_template(tokenize=True)``'s ids, whichever form this transformers returns them in."""
    if hasattr(rendered, "keys"):
        rendered = rendered["input_ids"]
    return list(rendered)


def prompt_ids(tokenizer, messages: list[dict], tools: list) -> list[int]:
    """A conversation's prompt ids with the tools' schemas, as TRL's GRPO renders them."""
    return _ids(tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=True))


def parse_turn(tokenizer, ids: list[int], prefix: list[int], tools: list) -> tuple[dict, bool]:
    """One assistant turn's ids -> ``(message, malformed)``, as TRL's ``parse_response``: a message with
    ``content`` and maybe ``tool_calls``; where parsing fails (a tool call that is not valid JSON, a call without
    a name), the decoded text as plain content, and ``malformed`` True."""
    try:
        if getattr(tokenizer, "response_template", None) is not None:
            parsed = tokenizer.parse_response(ids, prefix=prefix, tools=tools or None)
        else:
            parsed = tokenizer.parse_response(ids)
        if parsed is None:
            raise ValueError("nothing parsed")
        parsed = dict(parsed)
        if isinstance(parsed.get("content"), str):  # transformers#42249: eos left on the content
            parsed["content"] = parsed["content"].removesuffix(tokenizer.eos_token)
        parsed["content"] = parsed.get("content") or ""
        for call in parsed.get("tool_calls") or []:
            function = call.get("function", call) if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError(f"tool call without a name: {call!r}")
            if function.get("arguments") is None:
                function["arguments"] = {}
            elif isinstance(function["arguments"], str):
                function["arguments"] = json.loads(function["arguments"])
        return parsed, False
    except (ValueError, TypeError):
        return {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}, True
