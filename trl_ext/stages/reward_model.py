"""Scalar reward models from preference pairs (seed 003): TRL's ``RewardTrainer``, Bradley-Terry loss
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

from trl_ext.data.jsonl import check_messages
from trl_ext.errors import InputError
from trl_ext.rewards.classifier import ClassifierReward, is_conversation, message_text


class PreferenceError(InputError):
    """A preference row the trainer cannot use; the message names the row."""


def check_preferences(dataset) -> bool:
    """Every row usable; returns whether the rows are conversations."""
    columns = dataset.column_names
    missing = [c for c in ("chosen", "rejected") if c not in columns]
    if missing:
        raise PreferenceError(f"preference data needs 'chosen' and 'rejected' columns; it lacks {missing} "
                              f"(columns: {columns})")
    conversational = None
    for row, example in enumerate(dataset):
        for key in ("chosen", "rejected"):
            value = example[key]
            if value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value):
                raise PreferenceError(f"row {row}: {key!r} is missing or empty")
        if example["chosen"] == example["rejected"]:
            raise PreferenceError(f"row {row}: 'chosen' and 'rejected' are identical")
        for key in ("prompt", "chosen", "rejected"):
            check_messages(example.get(key), f"row {row}", key, PreferenceError)
        kinds = {is_conversation(example[k]) for k in ("prompt", "chosen", "rejected") if example.get(k) is not None}
        if len(kinds) > 1 or (conversational is not None and kinds != {conversational}):
            raise PreferenceError(f"row {row}: mixes text and conversations; use one format for every row")
        conversational = kinds.pop()
        if conversational and example.get("prompt") is None:
            short = next((k for k in ("chosen", "rejected") if len(example[k]) < 2), None)
            if short:  # the prompt is the messages before the answer: there must be some
                raise PreferenceError(f"row {row}: without a 'prompt', {short!r} needs the prompt's messages "
                                      "before its answer")
    return bool(conversational)


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


def tokenize_preferences(dataset, tokenizer):
    """``chosen_ids``/``rejected_ids`` (what ``RewardTrainer`` takes as already processed), margins kept."""
    check_preferences(dataset)
    prompts = dataset["prompt"] if "prompt" in dataset.column_names else [None] * len(dataset)
    columns = {"chosen_ids": [_ids(tokenizer, p, c) for p, c in zip(prompts, dataset["chosen"])],
               "rejected_ids": [_ids(tokenizer, p, r) for p, r in zip(prompts, dataset["rejected"])]}
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


def train_reward_model(model, tokenizer, train_dataset, *, output_dir: str, steps: int, batch_size: int,
                       learning_rate: float, seed: int = 0, warmup_steps: int = 0,
                       center_rewards_coefficient: float | None = None) -> list[dict]:
    """Run ``RewardTrainer`` for ``steps`` steps; returns its log history (losses, accuracies)."""
    from transformers import PrinterCallback, ProgressCallback
    from trl import RewardConfig, RewardTrainer

    from trl_ext.models.activation_checkpointing import checkpointing_training_argument
    from trl_ext.ppo.precision import launch_training_arguments

    if model.config.num_labels != 1:
        raise PreferenceError(f"a reward model has one output (num_labels=1); this one has {model.config.num_labels}")
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    args = RewardConfig(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
                        learning_rate=learning_rate, warmup_steps=warmup_steps, lr_scheduler_type="cosine",
                        seed=seed, **launch_training_arguments(),
                        report_to="none", logging_steps=max(1, steps // 10), save_strategy="no",
                        disable_tqdm=True, **checkpointing_training_argument(False), max_length=None,
                        center_rewards_coefficient=center_rewards_coefficient)
    trainer = RewardTrainer(model=model, args=args, train_dataset=tokenize_preferences(train_dataset, tokenizer),
                            processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    return trainer.state.log_history
