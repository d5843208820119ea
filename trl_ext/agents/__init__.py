"""Multi-turn rollouts with tools and environments, trained by trl-ext's PPOTrainer (TRL GRPOTrainer's ``tools``,
``environment_factory`` and ``rollout_func``): docs/multi-turn.md."""

from trl_ext.agents.templates import TOOL_TEMPLATES, tool_template, with_tool_template
from trl_ext.agents.tools import ToolResult

__all__ = ["TOOL_TEMPLATES", "ToolResult", "tool_template", "with_tool_template"]
