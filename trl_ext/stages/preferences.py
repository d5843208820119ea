"""Preference pairs in TRL's formats: ``chosen``/``rejected`` with or without ``prompt`` (and an optional
``margin``), as text or as conversations; every row checked, errors naming the row or the file's line."""

from __future__ import annotations

from pathlib import Path

from trl_ext.data.jsonl import check_messages
from trl_ext.data.sequences import is_conversation
from trl_ext.errors import InputError


class PreferenceError(InputError):
    """A preference row the trainer cannot use; the message names the row."""


def check_preferences(dataset) -> bool:
    """Every row usable; returns whether the rows are conversations."""
    columns = dataset.column_names
    missing = [c for c in ("chosen", "rejected") if c not in columns]
    if missing:
        raise PreferenceError(
            f"preference data needs 'chosen' and 'rejected' columns; it lacks {missing} (columns: {columns})"
        )
    conversational = None
    for row, example in enumerate(dataset):
        for key in ("chosen", "rejected"):
            value = example[key]
            if (
                value is None
                or (isinstance(value, str) and not value.strip())
                or (isinstance(value, list) and not value)
            ):
                raise PreferenceError(f"row {row}: {key!r} is missing or empty")
            if not isinstance(value, (str, list)):
                raise PreferenceError(
                    f"row {row}: {key!r} is {value!r} ({type(value).__name__}); an answer is text or a list of messages"
                )
        margin = example.get("margin")
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))):
            raise PreferenceError(f"row {row}: 'margin' is {margin!r}; a margin is a number")
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
                raise PreferenceError(
                    f"row {row}: without a 'prompt', {short!r} needs the prompt's messages before its answer"
                )
    return bool(conversational)


def load_preferences(path: str | Path):
    """Preference rows from a .jsonl file; errors name the line."""
    from trl_ext.data.jsonl import as_dataset, read_jsonl, require_one_format

    rows = read_jsonl(path, "preference")
    require_one_format(rows, "chosen", path)
    return as_dataset(rows)


def preference_split(path: str | Path, eval_n: int):
    """``(train, held-out)`` preference rows of a .jsonl file, every row checked; the last ``eval_n`` are held out."""
    data = load_preferences(path)
    check_preferences(data)
    if len(data) <= eval_n:
        raise InputError(f"{path} has {len(data)} rows: not enough for {eval_n} held-out pairs and training")
    return data.select(range(len(data) - eval_n)), data.select(range(len(data) - eval_n, len(data)))
