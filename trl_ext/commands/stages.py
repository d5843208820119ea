"""``trl-ext pretrain``, ``train-reward``, ``train-reward-model`` and ``eval``: each a stage of
``trl_ext.tasks.doubling.stages`` with its options."""

from __future__ import annotations

import json
from dataclasses import dataclass

from trl_ext.commands.parsing import Command, CommandResult
from trl_ext.runs.run import check_out_dir
from trl_ext.settings.fields import field
from trl_ext.tasks.doubling.stages import (
    EvalConfig,
    PretrainConfig,
    RewardConfig,
    RewardModelConfig,
    run_eval,
    run_pretrain,
    run_train_reward,
    run_train_reward_model,
)


@dataclass
class StageOutput:
    overwrite: bool = field(
        False, help="write into an --out directory that already holds files (its model is replaced)"
    )


def _checked_out(opts):
    """The stage's options once its ``--out`` is a directory it may write (checked before it trains; the stage makes
    it when it saves, so a stage refused later leaves none)."""
    check_out_dir(opts.stage.out, opts.output.overwrite)
    return opts.stage


def train_reward_model_command(opts) -> CommandResult:
    result = run_train_reward_model(_checked_out(opts))
    return CommandResult(
        f"train-reward-model: held-out pairwise accuracy={result['heldout_pairwise_accuracy']:.4f} "
        f"on {result['heldout_pairs']} pairs in {result['seconds']}s",
        result,
    )


def pretrain_command(opts) -> CommandResult:
    result = run_pretrain(_checked_out(opts))
    return CommandResult(
        f"pretrain: value_acc={result['value_acc']:.3f} charset spread="
        f"{json.dumps(result['charset_spread'])} loss {result['first_loss']:.3f}->"
        f"{result['final_loss']:.4f} in {result['seconds']}s",
        result,
    )


def train_reward_command(opts) -> CommandResult:
    result = run_train_reward(_checked_out(opts))
    return CommandResult(
        f"train-reward: held-out accuracy={result['heldout_accuracy']:.4f} in {result['seconds']}s", result
    )


def eval_command(opts) -> CommandResult:
    report = run_eval(opts.stage)
    parts = [
        f"{mode}: exact={report[mode]['exact']:.3f} value={report[mode]['value_acc']:.3f} "
        f"charset={report[mode]['charset_acc']:.3f}"
        for mode in ("greedy", "sampled")
        if mode in report
    ]
    return CommandResult("eval: " + "; ".join(parts), report, print_data=True)


PRETRAIN = Command(
    help="pretrain the tiny GPT-2 policy on no-prefix data",
    parts={"stage": PretrainConfig, "output": StageOutput},
    run=pretrain_command,
)
TRAIN_REWARD = Command(
    help="train the BERT charset classifier",
    parts={"stage": RewardConfig, "output": StageOutput},
    run=train_reward_command,
)
TRAIN_REWARD_MODEL = Command(
    help="train a scalar reward model on preference pairs (TRL's RewardTrainer)",
    parts={"stage": RewardModelConfig, "output": StageOutput},
    run=train_reward_model_command,
)
EVAL = Command(help="evaluate a policy on held-out prefix prompts", parts={"stage": EvalConfig}, run=eval_command)
