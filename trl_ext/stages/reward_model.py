"""Scalar reward models from preference pairs: TRL's ``RewardTrainer``, Bradley-Terry loss
``-log sigmoid(r_chosen - r_rejected - margin)`` with an optional ``margin`` column.

Data in TRL's preference formats: ``chosen``/``rejected`` with or without ``prompt``, as text or as
conversations. Text pairs are tokenized here as ``prompt + chosen`` exactly as a ``ClassifierReward``
scores ``prompt + completion`` later (TRL would append an eos to every text, which erases the
difference when the eos is what one of the two lacks). Conversations are rendered with the tokenizer's
chat template, as TRL does; a base without one (DeBERTa) gets the pair (prompt's text, answer's text),
which is how ``ClassifierReward`` scores conversations with such a tokenizer. Without ``prompt``, a
conversation's last message is the answer and the messages before it the prompt.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from trl_ext.data.sequences import is_conversation
from trl_ext.rewards.classifier import ClassifierReward, message_text
from trl_ext.stages.preferences import PreferenceError, check_preferences


def _split(prompt, answer) -> tuple:
    """``(prompt, answer)`` as scored: a conversation without a prompt is split before its last message."""
    if prompt is None and is_conversation(answer):
        return list(answer[:-1]), list(answer[-1:])
    return prompt, answer


def _ids(tokenizer, prompt, answer) -> list[int]:
    prompt, answer = _split(prompt, answer)
    if is_conversation(answer):
        if not getattr(tokenizer, "chat_template", None):  # as ClassifierReward scores it: a text pair
            return list(tokenizer(message_text(prompt), message_text(answer))["input_ids"])
        messages = list(prompt) + list(answer)
        return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    return tokenizer((prompt or "") + answer)["input_ids"]


def _row_ids(tokenizer, row: int, prompt, answer, key: str) -> list[int]:
    from trl_ext.data.prompt_dataset import encoding_errors

    fix = "give the reward model a base (--base, --reward-base) whose tokenizer covers the text"
    with encoding_errors(tokenizer, f"row {row}", answer, f"its {key!r} answer", fix):
        return _ids(tokenizer, prompt, answer)


def tokenize_preferences(dataset, tokenizer):
    """``chosen_ids``/``rejected_ids`` (what ``RewardTrainer`` takes as already processed), margins kept."""
    check_preferences(dataset)
    prompts = dataset["prompt"] if "prompt" in dataset.column_names else [None] * len(dataset)
    columns = {
        f"{key}_ids": [_row_ids(tokenizer, row, p, a, key) for row, (p, a) in enumerate(zip(prompts, dataset[key]))]
        for key in ("chosen", "rejected")
    }
    if "margin" in dataset.column_names:
        columns["margin"] = [float(m) for m in dataset["margin"]]
    from datasets import Dataset

    return Dataset.from_dict(columns)


def score_pairs(model, tokenizer, dataset, batch_size: int = 64) -> tuple[list[float], list[float]]:
    """Scores of every ``chosen`` and ``rejected`` answer, scored as PPO will score them."""
    scorer = ClassifierReward(model, tokenizer, batch_size=batch_size)
    prompts = dataset["prompt"] if "prompt" in dataset.column_names else [None] * len(dataset)

    def scores(answers):
        pairs = [_split(p, a) for p, a in zip(prompts, answers)]
        return scorer([p if p is not None else "" for p, _ in pairs], [a for _, a in pairs])

    return scores(dataset["chosen"]), scores(dataset["rejected"])


def pairwise_accuracy(chosen: list[float], rejected: list[float]) -> float:
    """Fraction of pairs scored ``chosen`` above ``rejected``."""
    return sum(c > r for c, r in zip(chosen, rejected)) / len(chosen)


def train_reward_model(
    model,
    tokenizer,
    train_dataset,
    *,
    output_dir: str,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int = 0,
    warmup_steps: int = 0,
    center_rewards_coefficient: float | None = None,
) -> list[dict]:
    """Run ``RewardTrainer`` for ``steps`` steps; returns its log history (losses, accuracies)."""
    from trl import RewardConfig, RewardTrainer

    from trl_ext.stages.sft import stage_training_arguments, train_quietly

    if model.config.num_labels != 1:
        raise PreferenceError(f"a reward model has one output (num_labels=1); this one has {model.config.num_labels}")
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    args = RewardConfig(
        **stage_training_arguments(output_dir, steps, batch_size, learning_rate, seed, warmup_steps=warmup_steps),
        center_rewards_coefficient=center_rewards_coefficient,
    )
    trainer = RewardTrainer(
        model=model, args=args, train_dataset=tokenize_preferences(train_dataset, tokenizer), processing_class=tokenizer
    )
    train_quietly(trainer)
    return trainer.state.log_history


def train_and_evaluate(
    model,
    tokenizer,
    train,
    heldout,
    out: str | Path,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    warmup_steps: int = 0,
    seed: int = 0,
    center_rewards_coefficient: float | None = None,
) -> dict:
    """Train on ``train``, score the ``heldout`` pairs as PPO will score them, save model and tokenizer in ``out``;
    returns the figures: seconds, losses, pairwise accuracy (over all and by the rows' ``kind``), score spreads."""
    import time

    from trl_ext.stages.sft import loss_ends

    start = time.perf_counter()
    history = train_reward_model(
        model,
        tokenizer,
        train,
        output_dir=str(out),
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        warmup_steps=warmup_steps,
        center_rewards_coefficient=center_rewards_coefficient or None,
    )
    seconds = time.perf_counter() - start
    chosen, rejected = score_pairs(model, tokenizer, heldout)
    by_kind = {}
    if "kind" in heldout.column_names:
        for kind in sorted(set(heldout["kind"])):
            rows = [i for i, k in enumerate(heldout["kind"]) if k == kind]
            by_kind[kind] = pairwise_accuracy([chosen[i] for i in rows], [rejected[i] for i in rows])
    Path(out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {
        "seconds": round(seconds, 2),
        **loss_ends(history),
        "heldout_pairwise_accuracy": pairwise_accuracy(chosen, rejected),
        "heldout_by_kind": by_kind,
        "heldout_pairs": len(heldout),
        "heldout_scores": {"chosen": _spread(chosen), "rejected": _spread(rejected)},
    }


def _spread(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4), "std": round(statistics.pstdev(values), 4)}


def load_reward_model_base(base: str, seed: int):
    """``(model, tokenizer)``: the ``base`` directory as a scalar reward model (one label), its new score head drawn
    from ``seed``."""
    import transformers

    from trl_ext.models.loading import load_sequence_classifier

    transformers.set_seed(seed)  # the new score head is drawn here, before RewardTrainer seeds anything
    return load_sequence_classifier(base, "reward model base", num_labels=1, ignore_mismatched_sizes=True)


def reward_model_stage(
    base: str,
    preferences: str,
    folder: str | Path,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    eval_n: int,
    say=print,
) -> str:
    """A scalar reward model trained on the ``preferences`` file from ``base`` into ``folder`` (its last ``eval_n``
    rows held out), or the one already there when nothing it ran with changed (``stages.reuse``)."""
    from trl_ext.models.directory import read_model_config
    from trl_ext.stages.preferences import preference_split
    from trl_ext.stages.reuse import fingerprint, reuse_or_run

    read_model_config(base, "reward model base")
    if not Path(preferences).is_file():
        raise FileNotFoundError(f"preference file {preferences!r} does not exist")
    options = {
        "base": base,
        "data": preferences,
        "steps": steps,
        "batch_size": batch_size,
        "lr": learning_rate,
        "seed": seed,
        "eval_n": eval_n,
        "center_rewards_coefficient": 0.01,
    }

    def run() -> dict:
        say(f"[reward_model] training on {preferences} from {base} ...")
        train, heldout = preference_split(preferences, eval_n)
        model, tokenizer = load_reward_model_base(base, seed)
        result = train_and_evaluate(
            model,
            tokenizer,
            train,
            heldout,
            folder,
            steps=steps,
            batch_size=batch_size,
            learning_rate=learning_rate,
            seed=seed,
            center_rewards_coefficient=options["center_rewards_coefficient"],
        )
        say(f"[reward_model] held-out pairwise accuracy {result['heldout_pairwise_accuracy']:.3f}")
        return {"stage": "reward_model", **result}

    reuse_or_run("reward_model", folder, {**options, "inputs": fingerprint(preferences, base)}, run, say)
    return str(folder)
