"""Option dataclass fields with their help text and choices (TRL's ``field(metadata={"help": ...})``).

Library configs declare their fields with ``field``; ``trl_ext.commands.parsing`` turns them into
flags and YAML keys. Kept apart so the library never imports the command line.
"""

from __future__ import annotations

import dataclasses

from trl_ext.errors import InputError


def cli_fields(cls) -> list[dataclasses.Field]:
    """The fields a command line or YAML file may set (``field(..., cli=False)`` marks the others)."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli", True)]


def field(default=dataclasses.MISSING, help: str = "", choices=None, cli: bool = True, **kwargs):
    metadata = {"help": help, "cli": cli}
    if choices is not None:
        metadata["choices"] = choices
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def require_positive(options, *names: str) -> None:
    """Refuse (``InputError``, naming it) the first of ``names`` whose value in ``options`` is not above zero."""
    for name in names:
        if not getattr(options, name) > 0:  # nan too
            raise InputError(f"{name} must be positive, got {getattr(options, name)}")


def options_dict(options) -> dict:
    """Every part of a command's options as a plain dict (saved beside results; equal dicts mean the same run).
    Where the values came from (``sources``) is no part: the same values are the same run."""
    return {part: dataclasses.asdict(value) for part, value in vars(options).items() if dataclasses.is_dataclass(value)}
