"""``trl-ext ppo``: PPO on the doubling task with any backend (``trl_ext.tasks.doubling.ppo_run``)."""

from __future__ import annotations

from trl_ext.commands.parsing import Command, CommandResult
from trl_ext.tasks.doubling.ppo_run import PPORunOptions, run_ppo
from trl_ext.tasks.doubling.ppo_settings import DOUBLING_COMMAND_PPO
from trl_ext.tasks.doubling.presets import preset_for

# The command's trainer options start from the doubling task's tuned values, not PPOConfig's LLM defaults.
DOUBLING_DEFAULTS = DOUBLING_COMMAND_PPO


def _preset(values: dict):
    return preset_for(values["backend"], values["advantage_estimator"])


def ppo_command(opts: PPORunOptions) -> CommandResult:
    summary = run_ppo(opts)
    return CommandResult(summary.get("summary", "ppo: done"), summary)


COMMAND = Command.for_options(
    PPORunOptions,
    help="PPO on the doubling task with the scratch or trl backend (or TRL's GRPO/RLOO)",
    run=ppo_command,
    defaults=DOUBLING_DEFAULTS,
    preset=_preset,
)
