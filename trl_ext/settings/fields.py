"""Option dataclass fields with their help text and choices (TRL's ``field(metadata={"help": ...})``).

Library configs declare their fields with ``field``; ``trl_ext.commands.parsing`` turns them into
flags and YAML keys. Kept apart so the library never imports the command line.
"""

from __future__ import annotations

import dataclasses
import numbers

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


# a scalar field's annotation -> what its value may be (bool is an int in Python, never a number here)
_SCALARS = {"int": (numbers.Integral,), "float": (numbers.Real,), "bool": (bool,), "str": (str,)}


def check_field_types(options) -> None:
    """Refuse (``InputError``) a scalar field holding another type, the first one found: a dict read from YAML
    passes ``1e-5`` as the text '1e-5' (PyYAML wants ``1.0e-5``), which would fail later as a comparison's
    TypeError."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        kinds = [k.strip() for k in str(f.type).split("|")]
        if value is None and "None" in kinds:
            continue
        allowed = [_SCALARS[k] for k in kinds if k in _SCALARS]
        if len(allowed) != len(kinds) - ("None" in kinds):  # a list, a dict or a class: not a scalar to check
            continue
        fits = any(isinstance(value, a) for a in allowed) and not (isinstance(value, bool) and "bool" not in kinds)
        if not fits:
            hint = ""
            if isinstance(value, str) and _is_number(value):
                hint = ": YAML reads a number without a dot before its exponent (1e-5) as text; write 1.0e-5"
            raise InputError(f"{f.name} is {value!r} ({type(value).__name__}), not {' or '.join(kinds)}{hint}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def options_dict(options) -> dict:
    """Every part of a command's options as a plain dict (saved beside results; equal dicts mean the same run).
    Where the values came from (``sources``) is no part: the same values are the same run."""
    return {part: dataclasses.asdict(value) for part, value in vars(options).items() if dataclasses.is_dataclass(value)}
