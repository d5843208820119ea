"""The supervised stages of the doubling pipeline, each a config dataclass and a ``run_*`` function."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from trl_ext.commands.parsing import Command, CommandResult
from trl_ext.options import field


@dataclass
class PretrainConfig:
    out: str = field(help="directory for the pretrained policy (save_pretrained)")
    seed: int = field(0, help="seed for data and initialisation")
    steps: int = field(2500, help="optimizer steps (600 already give greedy value_acc 1.0; the extra steps sharpen "
                       "sampled answers, which PPO's sampled exact-match depends on)")
    batch_size: int = field(64, help="sequences a step")
    lr: float = field(3e-3, help="peak learning rate (the seed's 1e-4 needs ~15,000 steps)")
    warmup_steps: int = field(100, help="linear warmup before the cosine decay")
    eval_n: int = field(1000, help="held-out questions for the final check")

    def __post_init__(self):
        _positive(self, "steps", "batch_size", "lr", "eval_n")


@dataclass
class RewardConfig:
    out: str = field(help="directory for the reward classifier (save_pretrained)")
    seed: int = field(0, help="seed for data and initialisation")
    steps: int = field(150, help="optimizer steps")
    batch_size: int = field(64, help="sequences a step")
    lr: float = field(1e-3, help="peak learning rate")
    warmup_steps: int = field(20, help="linear warmup before the cosine decay")
    eval_n: int = field(1000, help="held-out sequences for the accuracy check")

    def __post_init__(self):
        _positive(self, "steps", "batch_size", "lr", "eval_n")


@dataclass
class EvalConfig:
    policy: str = field(help="directory of a saved policy")
    n: int = field(1000, help="held-out prefix prompts (at most 1000)")
    seed: int = field(0, help="seed for prompt labels and sampling")
    sample: bool = field(False, help="also evaluate sampling at temperature 1")
    out: str | None = field(None, help="JSON file for the report (default: POLICY/eval.json)")

    def __post_init__(self):
        if not 0 < self.n <= 1000:
            raise ValueError(f"n must be in 1..1000, got {self.n}")


def _positive(cfg, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _train_stage(cfg, stage: str, build_model, make_dataset, use_labels: bool, evaluate, show_progress: bool) -> dict:
    """Build, train with ``supervised_loop``, evaluate, save; ``metrics.json`` is written last (the stage's
    "finished" marker for the demo)."""
    from trl_ext.doubling.artifacts import save_artifact
    from trl_ext.doubling.supervised import supervised_loop
    from trl_ext.doubling.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=cfg.seed)
    data = make_dataset(tokenizer, cfg.steps * cfg.batch_size, cfg.seed)
    result = supervised_loop(model, data, tokenizer.pad_token_id, batch_size=cfg.batch_size, lr=cfg.lr,
                             warmup_steps=cfg.warmup_steps, use_labels=use_labels, seed=cfg.seed,
                             desc=stage, show_progress=show_progress)
    summary = {
        "stage": stage, "config": asdict(cfg), "seconds": round(result.seconds, 2),
        "first_loss": result.losses[0], "final_loss": result.losses[-1],
        "parameters": sum(p.numel() for p in model.parameters()), **evaluate(model, tokenizer),
    }
    save_artifact(model, tokenizer, cfg.out)
    _write_json(Path(cfg.out) / "metrics.json", summary)
    return summary


def run_pretrain(cfg: PretrainConfig, show_progress: bool = True) -> dict:
    """Next-token pretraining on no-prefix data; saves the policy and ``metrics.json`` in ``cfg.out``."""
    from trl_ext.doubling.evaluate import evaluate_policy
    from trl_ext.doubling.models import build_policy
    from trl_ext.doubling.task import pretrain_dataset

    def evaluate(model, tokenizer):
        # Greedy decoding always takes the likeliest set; the spread the policy really has shows when sampling.
        report = evaluate_policy(model, tokenizer, n=cfg.eval_n, seed=cfg.seed, sample=True, prompt_prefixed=False)
        return {"value_acc": report["greedy"]["value_acc"], "sampled_value_acc": report["sampled"]["value_acc"],
                "charset_spread": report["sampled"]["charset_spread"]}

    return _train_stage(cfg, "pretrain", build_policy, pretrain_dataset, False, evaluate, show_progress)


def run_train_reward(cfg: RewardConfig, show_progress: bool = True) -> dict:
    """Train the charset classifier on labelled no-prefix sequences; saves it and ``metrics.json``."""
    from trl_ext.doubling.evaluate import classifier_accuracy
    from trl_ext.doubling.models import build_classifier
    from trl_ext.doubling.task import classifier_dataset

    def evaluate(model, tokenizer):
        heldout = classifier_dataset(tokenizer, cfg.eval_n, cfg.seed + 1, split="heldout")
        return {"heldout_accuracy": classifier_accuracy(model, tokenizer, heldout)}

    return _train_stage(cfg, "train-reward", build_classifier, classifier_dataset, True, evaluate, show_progress)


def run_eval(cfg: EvalConfig) -> dict:
    from trl_ext.doubling.artifacts import load_policy
    from trl_ext.doubling.evaluate import evaluate_policy

    model, tokenizer = load_policy(cfg.policy)
    report = evaluate_policy(model, tokenizer, n=cfg.n, seed=cfg.seed, sample=cfg.sample)
    report["policy"] = cfg.policy
    _write_json(Path(cfg.out) if cfg.out else Path(cfg.policy) / "eval.json", report)
    return report


def pretrain_command(opts) -> CommandResult:
    result = run_pretrain(opts.stage)
    return CommandResult(f"pretrain: value_acc={result['value_acc']:.3f} charset spread="
                         f"{json.dumps(result['charset_spread'])} loss {result['first_loss']:.3f}->"
                         f"{result['final_loss']:.4f} in {result['seconds']}s", result)


def train_reward_command(opts) -> CommandResult:
    result = run_train_reward(opts.stage)
    return CommandResult(f"train-reward: held-out accuracy={result['heldout_accuracy']:.4f} in {result['seconds']}s",
                         result)


def eval_command(opts) -> CommandResult:
    report = run_eval(opts.stage)
    parts = [f"{mode}: exact={report[mode]['exact']:.3f} value={report[mode]['value_acc']:.3f} "
             f"charset={report[mode]['charset_acc']:.3f}" for mode in ("greedy", "sampled") if mode in report]
    return CommandResult("eval: " + "; ".join(parts), report, print_data=True)


PRETRAIN = Command(help="pretrain the tiny GPT-2 policy on no-prefix data", parts={"stage": PretrainConfig},
                   run=pretrain_command)
TRAIN_REWARD = Command(help="train the BERT charset classifier", parts={"stage": RewardConfig},
                       run=train_reward_command)
EVAL = Command(help="evaluate a policy on held-out prefix prompts", parts={"stage": EvalConfig}, run=eval_command)
