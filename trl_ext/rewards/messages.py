"""Prompts and completions as reward functions receive them: TRL hands either text or a conversation."""

from __future__ import annotations

from trl_ext.rewards.base import RewardError


def message_text(value) -> str:
    """Text as is; a list of ``{"role", "content"}`` messages as their contents, one a line."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(m, dict) for m in value):
        return "\n".join(str(m.get("content", "")) for m in value)
    raise RewardError(f"expected text or a list of {{'role', 'content'}} messages, got {type(value).__name__}")
