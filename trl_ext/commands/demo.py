"""``trl-ext demo`` and ``trl-ext compare``: the whole doubling pipeline (``trl_ext.tasks.doubling.pipeline``), both PPO
backends side by side, once or over seeds."""

from __future__ import annotations

from dataclasses import dataclass

from trl_ext.commands.parsing import Command, CommandResult
from trl_ext.commands.ppo import DOUBLING_DEFAULTS
from trl_ext.commands.quiet import quiet
from trl_ext.settings.fields import field, require_positive
from trl_ext.tasks.doubling.pipeline import DemoOptions, Layout, run_pipeline


@dataclass
class SeedOptions:
    seeds: int = field(3, help="PPO seeds per backend (seed, seed+1, ...)")

    def __post_init__(self):
        require_positive(self, "seeds")


def demo_command(opts: DemoOptions) -> CommandResult:
    results = run_pipeline(
        opts,
        Layout("demo", "trl-ext demo: the doubling task", seeds=1, folder="ppo_{backend}{suffix}", aggregate=False),
        worker_setup=quiet,
    )
    return CommandResult(results["summary"], results)


def compare_command(opts: CompareOptions) -> CommandResult:
    results = run_pipeline(
        opts,
        Layout(
            "compare",
            "trl-ext compare: PPO backends (and TRL GRPO/RLOO) on the doubling task",
            seeds=opts.seeds.seeds,
            folder="{backend}{suffix}_seed{seed}",
            aggregate=True,
        ),
        worker_setup=quiet,
    )
    return CommandResult(results["summary"], results)


@dataclass
class CompareOptions(DemoOptions):
    """``demo``'s options and the number of seeds."""

    seeds: SeedOptions


# The demo's PPO budget: 150 updates of 64 at lr 1e-3 (compare runs 300 at 3e-4); why: docs/decisions.md,
# "How the defaults were chosen".
DEMO = Command.for_options(
    DemoOptions,
    help="the whole pipeline end to end, both backends",
    run=demo_command,
    defaults={**DOUBLING_DEFAULTS, "out": "demo_out", "total_episodes": 9600, "learning_rate": 1e-3},
)
COMPARE = Command.for_options(
    CompareOptions,
    help="both backends side by side over seeds",
    run=compare_command,
    defaults={**DOUBLING_DEFAULTS, "out": "compare_out"},
)
