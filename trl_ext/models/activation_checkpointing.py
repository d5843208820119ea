"""Activation checkpointing under the name the installed transformers takes.

transformers 5.24 renamed ``gradient_checkpointing`` (the ``TrainingArguments`` field, its ``_kwargs`` and the
models' ``gradient_checkpointing_enable``) to ``activation_checkpointing``: the old names warn and go in v6.
TRL's configs default the field to True, so a TRL config built with the old name set warns on every run.
"""

from __future__ import annotations

from dataclasses import fields
from functools import cache


@cache
def _field_name() -> str:
    from transformers import TrainingArguments

    names = {f.name for f in fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def checkpointing_training_argument(enabled: bool) -> dict:
    """The keyword of a ``TrainingArguments`` (TRL's configs) that turns activation checkpointing on or off."""
    return {_field_name(): enabled}


def enable_activation_checkpointing(model) -> None:
    """Recompute activations in the backward pass. ``use_reentrant=False``: gradients reach LoRA adapters even
    when the inputs need none."""
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
