"""The supervised stages of the doubling pipeline (and the evaluation of a policy), each a config dataclass and a
``run_*`` function; ``train-reward-model`` also trains a reward model of any base on any preference file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from trl_ext.errors import InputError
from trl_ext.settings.fields import field, require_positive


@dataclass
class PretrainConfig:
    out: str = field(help="directory for the pretrained policy (save_pretrained)")
    seed: int = field(0, help="seed for data and initialisation")
    steps: int = field(
        2500,
        help="optimizer steps (600 already give greedy value_acc 1.0; the extra steps sharpen "
        "sampled answers, which PPO's sampled exact-match depends on)",
    )
    batch_size: int = field(64, help="sequences a step")
    lr: float = field(3e-3, help="peak learning rate (the seed's 1e-4 needs ~15,000 steps)")
    warmup_steps: int = field(100, help="linear warmup before the cosine decay")
    eval_n: int = field(1000, help="held-out questions for the final check")

    def __post_init__(self):
        require_positive(self, "steps", "batch_size", "lr", "eval_n")
        _check_warmup(self)
        _check_held_out("eval_n", self.eval_n)


def _check_warmup(cfg) -> None:
    if cfg.warmup_steps < 0:
        raise InputError(f"warmup_steps must not be negative, got {cfg.warmup_steps}")


def _check_held_out(name: str, n: int) -> None:
    """``n`` held-out questions exist (checked before a stage trains, not after)."""
    from trl_ext.tasks.doubling.task import check_held_out  # here: the command line imports no datasets to parse

    check_held_out(name, n)


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
        require_positive(self, "steps", "batch_size", "lr", "eval_n")
        _check_warmup(self)


@dataclass
class EvalConfig:
    policy: str = field(help="directory of a saved policy")
    n: int = field(1000, help="held-out prefix prompts (at most 1000)")
    seed: int = field(0, help="seed for prompt labels and sampling")
    sample: bool = field(False, help="also evaluate sampling at temperature 1")
    out: str | None = field(None, help="JSON file for the report (default: POLICY/eval.json)")

    def __post_init__(self):
        _check_held_out("n", self.n)


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _train_stage(
    cfg,
    stage: str,
    build_model,
    make_dataset,
    use_labels: bool,
    evaluate,
    show_progress: bool,
    rank: int = 0,
    world_size: int = 1,
) -> dict | None:
    """Build, train with ``supervised_loop``, save, evaluate; ``metrics.json`` is written last (the stage's
    "finished" marker for the demo), and a failed evaluation loses no trained model. Data parallel
    (``world_size > 1``): rank 0 saves and evaluates, the others return None."""
    from trl_ext.tasks.doubling.artifacts import save_artifact
    from trl_ext.tasks.doubling.supervised import supervised_loop
    from trl_ext.tasks.doubling.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=cfg.seed)
    data = make_dataset(tokenizer, cfg.steps * cfg.batch_size, cfg.seed)
    result = supervised_loop(
        model,
        data,
        tokenizer.pad_token_id,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        use_labels=use_labels,
        seed=cfg.seed,
        desc=stage,
        show_progress=show_progress and rank == 0,
        rank=rank,
        world_size=world_size,
    )
    if rank != 0:
        return None
    save_artifact(model, tokenizer, cfg.out)
    summary = {
        "stage": stage,
        "config": asdict(cfg),
        "seconds": round(result.seconds, 2),
        "processes": world_size,
        "first_loss": result.losses[0],
        "final_loss": result.losses[-1],
        "parameters": sum(p.numel() for p in model.parameters()),
        **evaluate(model, tokenizer),
    }
    _write_json(Path(cfg.out) / "metrics.json", summary)
    return summary


def run_pretrain(cfg: PretrainConfig, show_progress: bool = True, rank: int = 0, world_size: int = 1) -> dict | None:
    """Next-token pretraining on no-prefix data; saves the policy and ``metrics.json`` in ``cfg.out``
    (``world_size > 1``: this rank's share of a data-parallel run, see ``supervised_loop``)."""
    from trl_ext.tasks.doubling.evaluate import evaluate_policy
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.task import pretrain_dataset

    def evaluate(model, tokenizer):
        # Greedy decoding always takes the likeliest set; the spread the policy really has shows when sampling.
        report = evaluate_policy(model, tokenizer, n=cfg.eval_n, seed=cfg.seed, sample=True, prompt_prefixed=False)
        return {
            "value_acc": report["greedy"]["value_acc"],
            "sampled_value_acc": report["sampled"]["value_acc"],
            "charset_spread": report["sampled"]["charset_spread"],
        }

    return _train_stage(
        cfg, "pretrain", build_policy, pretrain_dataset, False, evaluate, show_progress, rank, world_size
    )


def run_train_reward(cfg: RewardConfig, show_progress: bool = True) -> dict:
    """Train the charset classifier on labelled no-prefix sequences; saves it and ``metrics.json``."""
    from trl_ext.tasks.doubling.evaluate import classifier_accuracy
    from trl_ext.tasks.doubling.models import build_classifier
    from trl_ext.tasks.doubling.task import classifier_dataset

    def evaluate(model, tokenizer):
        heldout = classifier_dataset(tokenizer, cfg.eval_n, cfg.seed + 1, split="heldout")
        return {"heldout_accuracy": classifier_accuracy(model, tokenizer, heldout)}

    return _train_stage(cfg, "train-reward", build_classifier, classifier_dataset, True, evaluate, show_progress)


def run_eval(cfg: EvalConfig) -> dict:
    from trl_ext.tasks.doubling.artifacts import load_policy
    from trl_ext.tasks.doubling.evaluate import evaluate_policy

    model, tokenizer = load_policy(cfg.policy)
    report = evaluate_policy(model, tokenizer, n=cfg.n, seed=cfg.seed, sample=cfg.sample)
    report["policy"] = cfg.policy
    _write_json(Path(cfg.out) if cfg.out else Path(cfg.policy) / "eval.json", report)
    return report


@dataclass
class RewardModelConfig:
    out: str = field(help="directory for the scalar reward model (save_pretrained)")
    base: str | None = field(
        None,
        help="a model directory that loads as AutoModelForSequenceClassification "
        "(DeBERTa-v3, Qwen2, ...); default: the doubling task's BERT, built from its config",
    )
    data: str | None = field(
        None,
        help="preference .jsonl (chosen/rejected, optional prompt and margin; text or "
        "conversations); default: the doubling task's preference pairs",
    )
    steps: int = field(
        4800,
        help="optimizer steps (docs/decisions.md: what the doubling pairs need)",
    )
    batch_size: int = field(32, help="pairs a step")
    lr: float = field(1e-3, help="peak learning rate (cosine decay; 3e-3 diverged on the doubling pairs)")
    warmup_steps: int = field(20, help="linear warmup")
    seed: int = field(0, help="seed for data and initialisation")
    eval_n: int = field(1000, help="held-out pairs for the pairwise accuracy (from --data: the last eval_n rows)")
    center_rewards_coefficient: float | None = field(
        0.01,
        help="weight of TRL's (r_chosen + r_rejected)^2 term "
        "(Eisenstein et al. 2023; TRL suggests 0.01): it keeps scores "
        "near zero, so right answers to different prompts score alike "
        "and PPO's critic need not learn a per-prompt offset; 0: off",
    )

    def __post_init__(self):
        require_positive(self, "steps", "batch_size", "lr", "eval_n")
        _check_warmup(self)
        if self.center_rewards_coefficient is not None and self.center_rewards_coefficient < 0:
            raise InputError(f"center_rewards_coefficient must be >= 0, got {self.center_rewards_coefficient}")


def run_train_reward_model(cfg: RewardModelConfig) -> dict:
    """Train a scalar reward model on preference pairs and save it with its held-out pairwise accuracy (the library's
    ``train_and_evaluate``; without ``data`` or ``base``, the doubling task's pairs and BERT)."""
    from trl_ext.stages.reward_model import train_and_evaluate

    if cfg.data:
        from trl_ext.stages.preferences import preference_split

        train, heldout = preference_split(cfg.data, cfg.eval_n)
    else:
        from trl_ext.tasks.doubling.preferences import preference_dataset

        train = preference_dataset(cfg.steps * cfg.batch_size, cfg.seed, "train")
        heldout = preference_dataset(cfg.eval_n, cfg.seed + 1, "heldout")
    model, tokenizer = _reward_model_base(cfg)
    result = train_and_evaluate(
        model,
        tokenizer,
        train,
        heldout,
        cfg.out,
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        learning_rate=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        seed=cfg.seed,
        center_rewards_coefficient=cfg.center_rewards_coefficient,
    )
    summary = {"stage": "train-reward-model", "config": asdict(cfg), **result}
    _write_json(Path(cfg.out) / "metrics.json", summary)
    return summary


def _reward_model_base(cfg: RewardModelConfig):
    if cfg.base is None:
        import torch

        from trl_ext.tasks.doubling.models import build_classifier
        from trl_ext.tasks.doubling.tokenizer import build_tokenizer

        tokenizer = build_tokenizer()
        torch.manual_seed(cfg.seed)
        return build_classifier(tokenizer, seed=cfg.seed, num_labels=1), tokenizer
    from trl_ext.stages.reward_model import load_reward_model_base

    return load_reward_model_base(cfg.base, cfg.seed)
