"""Any Hugging Face sequence classifier as a reward function."""

from __future__ import annotations

from collections.abc import Callable

import torch

from trl_ext.rewards.base import RewardError, RewardFunction, require_column


class ClassifierReward(RewardFunction):
    """Score completions with an ``AutoModelForSequenceClassification``.

    * scalar mode (``num_labels == 1``): the single logit, the usual RLHF reward model;
    * label-conditional mode: the logit of the class named by ``label_column`` (a dataset
      column) or by ``label_fn(prompt)``, as seed 000 rewards the requested character set.

    ``pair=False`` scores ``prompt + completion`` as one text; ``pair=True`` passes
    ``(prompt, completion)`` as a text pair, as DeBERTa reward models are called (seed 004).
    Inputs are padded on the right so position embeddings match training.
    """

    def __init__(self, model, tokenizer, *, label_column: str | None = None,
                 label_fn: Callable[[str], int] | None = None, pair: bool = False, max_length: int = 512,
                 batch_size: int = 64, name: str | None = None):
        num_labels = model.config.num_labels
        if label_column is not None and label_fn is not None:
            raise RewardError("give label_column or label_fn, not both")
        conditional = label_column is not None or label_fn is not None
        if num_labels == 1 and conditional:
            raise RewardError("a scalar reward model (num_labels=1) takes no label_column/label_fn")
        if num_labels > 1 and not conditional:
            raise RewardError(f"a classifier with {num_labels} labels needs label_column or label_fn "
                              "to pick the class whose logit is the reward")
        if batch_size <= 0 or max_length <= 0:
            raise RewardError("batch_size and max_length must be positive")
        self.model, self.tokenizer = model, tokenizer
        self.label_column, self.label_fn = label_column, label_fn
        self.pair, self.max_length, self.batch_size = pair, max_length, batch_size
        self.name = name or ("classifier_label_logit" if conditional else "classifier_score")

    def _labels(self, prompts: list[str], columns: dict) -> list[int] | None:
        if self.label_column is not None:
            labels = require_column(self.__name__, columns, self.label_column)
        elif self.label_fn is not None:
            labels = [self.label_fn(p) for p in prompts]
        else:
            return None
        num_labels = self.model.config.num_labels
        for index, label in enumerate(labels):
            if not isinstance(label, int) or not 0 <= label < num_labels:
                raise RewardError(f"reward {self.__name__!r}: label {label!r} at index {index} is not a class "
                                  f"of this {num_labels}-label classifier")
        return labels

    @torch.no_grad()
    def score(self, prompts, completions, **columns):
        labels = self._labels(prompts, columns)
        self.model.eval()
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            texts = (prompts[start:stop], completions[start:stop]) if self.pair else \
                ([p + c for p, c in zip(prompts[start:stop], completions[start:stop])],)
            encoded = self.tokenizer(*texts, padding=True, truncation=True, max_length=self.max_length,
                                     padding_side="right", return_tensors="pt")
            if getattr(self.model.config, "type_vocab_size", 2) <= 1:  # no segment embeddings to index
                encoded.pop("token_type_ids", None)
            logits = self.model(**{k: v.to(device) for k, v in encoded.items()}).logits.float()
            if labels is None:
                scores.extend(logits[:, 0].tolist())
            else:
                picked = torch.as_tensor(labels[start:stop], device=device)
                scores.extend(logits.gather(1, picked[:, None])[:, 0].tolist())
        return scores
