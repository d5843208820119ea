"""Dataclass configs from the command line and YAML files (TRL's ``TrlParser`` style).

Values come from, in rising priority: the dataclass defaults, ``--config FILE.yaml``, flags.
A YAML key that is not a field is an error naming the key; a YAML value is converted to the
field's type (YAML reads ``1e-3`` as a string) or refused with the key named. Flags must be
written out in full: argparse's abbreviations are off, so ``--step`` never stands for ``--steps``.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path

from trl_ext.options import cli_fields


class ConfigError(ValueError):
    pass


def _arg_type(tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _arg_type(inner[0])
    return tp


def _bool(text: str) -> bool:
    lowered = str(text).lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def convert_value(key: str, value, tp):
    """A YAML value as the field's type ``tp`` (str, int, float, bool); ConfigError naming ``key`` otherwise."""
    if value is None:
        return None
    try:
        if tp is bool:
            return value if isinstance(value, bool) else _bool(value)
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return str(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        raise ConfigError(f"option {key!r}: {value!r} is not a valid {tp.__name__}") from None
    return value


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls) -> None:
    hints = typing.get_type_hints(cls)
    parser.add_argument("--config", type=Path, default=None, help="YAML file of options (flags override it)")
    for field in cli_fields(cls):
        tp = _arg_type(hints[field.name])
        flag = "--" + field.name.replace("_", "-")
        help_text = field.metadata.get("help", "")
        default = field.default if field.default is not dataclasses.MISSING else None
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if tp is bool:
            parser.add_argument(flag, dest=field.name, type=_bool, nargs="?", const=True, default=default,
                                help=f"{help_text} (default: {default})")
        else:
            choices = field.metadata.get("choices")
            parser.add_argument(flag, dest=field.name, type=tp, default=default, choices=choices,
                                help=f"{help_text} (default: {default})" if not required else help_text)


def _load_yaml(path: Path) -> dict:
    import yaml

    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of option: value")
    return data


def build_config(cls, namespace: argparse.Namespace, argv_flags: set[str]):
    """Merge defaults, the YAML file and explicitly given flags into a ``cls`` instance."""
    names = {f.name for f in cli_fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    if namespace.config is not None:
        for key, value in _load_yaml(namespace.config).items():
            key_name = str(key).replace("-", "_")
            if key_name not in names:
                raise ConfigError(f"config file {str(namespace.config)!r}: unknown option {key!r} "
                                  f"(known: {', '.join(sorted(names))})")
            values[key_name] = convert_value(str(key), value, _arg_type(hints[key_name]))
    for name in names:
        if name in argv_flags or name not in values:
            value = getattr(namespace, name)
            if value is not None or name not in values:
                values[name] = value
    missing = [f.name for f in cli_fields(cls) if values.get(f.name) is None
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"missing required option(s): {', '.join('--' + m.replace('_', '-') for m in missing)}")
    return cls(**values)


def given_flags(argv: list[str]) -> set[str]:
    """Field names of the flags written on the command line (``--lr 1`` or ``--lr=1``)."""
    return {a[2:].split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")}
