"""``trl-ext pretrain``, ``train-reward``, ``train-reward-model`` and ``eval``: each a stage of
``trl_ext.tasks.doubling.stages`` with its options."""

from __future__ import annotations

import json

from trl_ext.commands.parsing import Command, CommandResult
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


def train_reward_model_command(opts) -> CommandResult:
    result = run_train_reward_model(opts.stage)
    return CommandResult(
        f"train-reward-model: held-out pairwise accuracy={result['heldout_pairwise_accuracy']:.4f} "
        f"on {result['heldout_pairs']} pairs in {result['seconds']}s",
        result,
    )


def pretrain_command(opts) -> CommandResult:
    result = run_pretrain(opts.stage)
    return CommandResult(
        f"pretrain: value_acc={result['value_acc']:.3f} charset spread="
        f"{json.dumps(result['charset_spread'])} loss {result['first_loss']:.3f}->"
        f"{result['final_loss']:.4f} in {result['seconds']}s",
        result,
    )


def train_reward_command(opts) -> CommandResult:
    result = run_train_reward(opts.stage)
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
    help="pretrain the tiny GPT-2 policy on no-prefix data", parts={"stage": PretrainConfig}, run=pretrain_command
)
TRAIN_REWARD = Command(
    help="train the BERT charset classifier", parts={"stage": RewardConfig}, run=train_reward_command
)
TRAIN_REWARD_MODEL = Command(
    help="train a scalar reward model on preference pairs (TRL's RewardTrainer)",
    parts={"stage": RewardModelConfig},
    run=train_reward_model_command,
)
EVAL = Command(help="evaluate a policy on held-out prefix prompts", parts={"stage": EvalConfig}, run=eval_command)
