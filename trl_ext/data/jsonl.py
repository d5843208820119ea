"""Reading the .jsonl files users hand the library (prompts, SFT rows, preferences): every error names the
file and the line."""

from __future__ import annotations

import json
from pathlib import Path

from trl_ext.errors import InputError


def read_jsonl(path: str | Path, what: str) -> list[tuple[int, dict]]:
    """``(line number, object)`` for each non-empty line of ``path``; ``what`` names the file in errors."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} file {str(path)!r} does not exist")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{number}: not valid JSON ({err})") from err
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    if not rows:
        raise InputError(f"{what} file {str(path)!r} holds no rows")
    return rows


def check_messages(value, where: str, key: str, error=InputError) -> None:
    """A list given as ``key`` is a conversation: every message a ``{"role", "content"}`` of text."""
    if not isinstance(value, list):
        return
    for number, message in enumerate(value):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise error(
                f"{where}: message {number} of {key!r} is {message!r:.80}; expected "
                '{"role": "...", "content": "..."} with text values'
            )


def require_one_format(rows: list[tuple[int, dict]], key: str, path: str | Path) -> None:
    """Every row's ``key`` is text, or every row's is a conversation (a list of messages): not both."""
    first = isinstance(rows[0][1].get(key), list)
    for number, row in rows:
        if isinstance(row.get(key), list) != first:
            raise InputError(
                f"{path}:{number}: mixes text and conversations (line {rows[0][0]} is "
                f"{'a conversation' if first else 'text'}); use one format for every row"
            )


def as_dataset(rows: list[tuple[int, dict]]):
    from datasets import Dataset

    keys = sorted(set().union(*(row for _, row in rows)))
    return Dataset.from_dict({k: [row.get(k) for _, row in rows] for k in keys})
