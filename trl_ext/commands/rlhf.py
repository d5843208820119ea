"""``trl-ext rlhf``: real-LLM RLHF with LoRA, its options and run in ``trl_ext.runs.rlhf``."""

from __future__ import annotations

from trl_ext.commands.parsing import Command, CommandResult
from trl_ext.runs.rlhf import run_rlhf
from trl_ext.runs.rlhf_options import RLHF_DEFAULTS, RLHFOptions, rlhf_preset


def rlhf_command(opts: RLHFOptions) -> CommandResult:
    summary = run_rlhf(opts)
    return CommandResult(summary["summary"], summary)


COMMAND = Command.for_options(
    RLHFOptions,
    help="real-LLM RLHF with LoRA: optional SFT, optional reward model from preferences, then PPO",
    run=rlhf_command,
    defaults=RLHF_DEFAULTS,
    preset=rlhf_preset,
)
