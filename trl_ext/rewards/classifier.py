"""Any Hugging Face sequence classifier as a reward function."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from pathlib import Path

import torch

from trl_ext.data.sequences import is_conversation
from trl_ext.rewards.base import RewardError, RewardFunction, require_column


def message_text(messages: list[dict]) -> str:
    return "\n".join(str(m.get("content", "")) for m in messages)


LABEL_SCORES = ("logit", "probability")


class ClassifierReward(RewardFunction):
    """Score completions with an ``AutoModelForSequenceClassification``.

    * scalar mode (``num_labels == 1``): the single logit, the usual RLHF reward model;
    * label-conditional mode: the logit of the class named by ``label_column`` (a dataset
      column) or by ``label_fn(prompt)``, as the doubling task rewards the requested character set; or, with
      ``label_score="probability"``, that class's softmax probability. A cross-entropy classifier's logits are
      fixed only up to a shift per input, so one class's logit on inputs of two other classes can differ by
      several units: the probability puts every other class near 0.

    Text: ``pair=False`` scores ``prompt + completion`` as one text; ``pair=True`` passes
    ``(prompt, completion)`` as a text pair, as DeBERTa reward models are called.
    Conversations (TRL's format): rendered with the reward tokenizer's chat template when it
    has one, as TRL's GRPO scores with a reward model; otherwise scored as a pair of the
    prompt's and the completion's message contents. Inputs are padded on the right.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        label_column: str | None = None,
        label_fn: Callable[[str], int] | None = None,
        pair: bool = False,
        max_length: int = 512,
        batch_size: int = 64,
        name: str | None = None,
        label_score: str = "logit",
    ):
        num_labels = model.config.num_labels
        if label_score not in LABEL_SCORES:
            raise RewardError(f"label_score must be one of {', '.join(LABEL_SCORES)}, got {label_score!r}")
        if label_column is not None and label_fn is not None:
            raise RewardError("give label_column or label_fn, not both")
        conditional = label_column is not None or label_fn is not None
        if num_labels == 1 and conditional:
            raise RewardError("a scalar reward model (num_labels=1) takes no label_column/label_fn")
        if num_labels > 1 and not conditional:
            raise RewardError(
                f"a classifier with {num_labels} labels needs label_column or label_fn "
                "to pick the class whose logit is the reward"
            )
        if batch_size <= 0 or max_length <= 0:
            raise RewardError("batch_size and max_length must be positive")
        from trl_ext.models.loading import pad_with_eos

        pad_with_eos(tokenizer, "reward model", "given to ClassifierReward", RewardError)  # what a path gets
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id  # decoder classifiers score the last non-pad token
        self.model, self.tokenizer = model, tokenizer
        self.label_column, self.label_fn = label_column, label_fn
        self.pair, self.max_length, self.batch_size = pair, max_length, batch_size
        self.label_score = label_score
        self.name = name or (f"classifier_label_{label_score}" if conditional else "classifier_score")

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str = "auto", **kwargs) -> ClassifierReward:
        """A scalar reward model from a ``save_pretrained`` directory (what a path in ``reward_funcs`` means),
        in ``dtype`` ('auto': the checkpoint's; the reward model is frozen, bf16 scores as well)."""
        from trl_ext.models.loading import load_sequence_classifier

        conditional = "label_column" in kwargs or "label_fn" in kwargs
        model, tokenizer = load_sequence_classifier(
            path,
            "reward model",
            dtype,
            labels=None if conditional else 1,
            why="not a scalar reward model: build ClassifierReward(model, tokenizer, label_column=...) to pick the "
            "class whose logit is the reward",
        )
        return cls(model, tokenizer, name=kwargs.pop("name", Path(path).name), **kwargs)

    def to(self, device) -> ClassifierReward:
        """Move the classifier (trainers call this so that scoring runs where the policy runs)."""
        self.model.to(device)
        return self

    def _labels(self, prompts: list, columns: dict) -> list[int] | None:
        if self.label_column is not None:
            labels = require_column(self.__name__, columns, self.label_column)
        elif self.label_fn is not None:
            labels = [self.label_fn(p) for p in prompts]
        else:
            return None
        num_labels = self.model.config.num_labels
        for index, label in enumerate(labels):
            # numpy's integers are classes too; a bool is not (True would silently be class 1)
            if isinstance(label, bool) or not isinstance(label, numbers.Integral) or not 0 <= label < num_labels:
                raise RewardError(
                    f"reward {self.__name__!r}: label {label!r} ({type(label).__name__}) at index {index} is not a "
                    f"class of this {num_labels}-label classifier (an int in 0..{num_labels - 1})"
                )
        return [int(label) for label in labels]

    def _texts(self, prompts: list, completions: list) -> tuple[tuple[list[str], ...], bool]:
        """The classifier's inputs (one text, or a pair) and whether special tokens must still be added."""
        if not is_conversation(prompts[0]):
            return ((prompts, completions) if self.pair else ([p + c for p, c in zip(prompts, completions)],)), True
        if getattr(self.tokenizer, "chat_template", None):
            rendered = [
                self.tokenizer.apply_chat_template(list(p) + list(c), tokenize=False)
                for p, c in zip(prompts, completions)
            ]
            return (rendered,), False  # the template already holds the special tokens
        return ([message_text(p) for p in prompts], [message_text(c) for c in completions]), True

    @torch.no_grad()
    def score(self, prompts, completions, **columns):
        labels = self._labels(prompts, columns)
        self.model.eval()
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            texts, add_special = self._texts(prompts[start:stop], completions[start:stop])
            encoded = self.tokenizer(
                *texts,
                padding=True,
                truncation=True,
                max_length=self.max_length,
                padding_side="right",
                add_special_tokens=add_special,
                return_tensors="pt",
            )
            if getattr(self.model.config, "type_vocab_size", 2) <= 1:  # no segment embeddings to index
                encoded.pop("token_type_ids", None)
            logits = self.model(**{k: v.to(device) for k, v in encoded.items()}).logits.float()
            if labels is None:
                scores.extend(logits[:, 0].tolist())
            else:
                picked = torch.as_tensor(labels[start:stop], device=device)
                if self.label_score == "probability":
                    logits = logits.softmax(-1)
                scores.extend(logits.gather(1, picked[:, None])[:, 0].tolist())
        return scores
