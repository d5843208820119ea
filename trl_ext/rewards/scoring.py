"""Scoring a batch of rollouts as TRL's GRPO scores it: every reward function called by keyword with the
dataset's other columns, ``None`` rows left out, the weighted sum per completion.

``RewardScorer`` is what a trainer holds: the functions, their weights and names, and what the functions
log through GRPO's ``log_metric`` / ``log_extra`` keywords until the trainer collects it with the scores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from trl_ext.data.sequences import is_conversation
from trl_ext.errors import InputError
from trl_ext.rewards.base import call_reward, check_signature, combine_rewards, reward_name


def resolve_reward_funcs(reward_funcs, dtype: str = "auto") -> list[Callable]:
    """A callable, a path to a sequence classifier (loaded in ``dtype``), or a list of them -> a list of callables."""
    from trl_ext.rewards.classifier import ClassifierReward

    if reward_funcs is None:
        return []
    items = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    resolved = []
    for item in items:
        if isinstance(item, (str, Path)):
            item = ClassifierReward.from_pretrained(item, dtype=dtype)
        elif _is_model_object(item):
            item = _model_as_reward(item)
        if not callable(item):
            raise InputError(
                f"reward_funcs holds a {type(item).__name__}: expected a callable or a path to a sequence classifier"
            )
        check_signature(item)
        resolved.append(item)
    return resolved


def _is_model_object(item) -> bool:
    import torch

    return isinstance(item, torch.nn.Module) and hasattr(getattr(item, "config", None), "num_labels")


def _model_as_reward(model):
    """A sequence classifier object, as TRL's GRPO takes one: scored with the tokenizer saved beside it."""
    from transformers import AutoTokenizer

    from trl_ext.rewards.classifier import ClassifierReward

    source = getattr(model, "name_or_path", "") or ""
    kind = type(model).__name__
    if not kind.endswith("ForSequenceClassification"):
        raise InputError(f"reward_funcs holds a {kind}: a reward model is a sequence classifier")
    if not source or not (Path(source) / "config.json").exists():
        raise InputError(
            f"reward_funcs holds a {kind} object with no folder to read its tokenizer from: pass its directory, "
            "or ClassifierReward(model, tokenizer)"
        )
    return ClassifierReward(model, AutoTokenizer.from_pretrained(source), name=Path(source).name)


def as_completions(prompts: Sequence, texts: list[str]) -> list:
    """Completions in the form TRL's GRPO hands them: text, or one assistant message for conversations."""
    if prompts and is_conversation(prompts[0]):
        return [[{"role": "assistant", "content": text}] for text in texts]
    return texts


class RewardScorer:
    """The reward functions of a run, their weights (``None``: all 1.0) and names."""

    def __init__(self, reward_funcs: list[Callable], weights: list[float] | None = None):
        self.funcs = reward_funcs
        self.names = [reward_name(f) for f in reward_funcs]
        self.weights = weights or [1.0] * len(reward_funcs)
        if len(self.weights) != len(reward_funcs):
            raise InputError(f"reward_weights has {len(self.weights)} values for {len(reward_funcs)} reward functions")
        self._logged: dict[str, list[float]] = {}

    def score(
        self, rows: dict, prompts: list, completions: list, completion_ids: list[list[int]], trainer_state
    ) -> tuple[list[float], dict]:
        """Every function called as GRPO calls it; their weighted sum (GRPO's None rule) per completion, and the
        stats: each function's mean over the rows it scored, and what the functions logged meanwhile."""
        columns = {k: v for k, v in rows.items() if k not in ("input_ids", "attention_mask", "prompt")}
        kwargs = dict(
            columns,
            completion_ids=completion_ids,
            trainer_state=trainer_state,
            log_metric=self.log_metric,
            log_extra=self.log_extra,
        )
        per_function = [call_reward(fn, prompts, completions, allow_none=True, **kwargs) for fn in self.funcs]
        scores = combine_rewards(per_function, self.weights, self.names, prompts)
        stats = {}
        for name, values in zip(self.names, per_function):
            scored = [v for v in values if v is not None]
            if scored:
                stats[f"rewards/{name}/mean"] = sum(scored) / len(scored)
        for name, values in self._logged.items():
            stats[name] = sum(values) / len(values)
        self._logged = {}
        return scores, stats

    def log_metric(self, name: str, value: float) -> None:
        """``log_metric`` for reward functions (GRPO's keyword): averaged into this update's stats."""
        self._logged.setdefault(name, []).append(float(value))

    def log_extra(self, column: str, values: Sequence) -> None:
        """``log_extra`` for reward functions (GRPO's keyword): numeric values are averaged into
        ``extra/COLUMN``; there is no completions table here, so text values are not kept."""
        numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numbers:
            self._logged.setdefault(f"extra/{column}", []).extend(numbers)
