"""Option dataclasses from the command line and YAML files (TRL's ``TrlParser`` style).

A command combines several dataclasses, one per concern (trainer, models, output, ...); each
field becomes a flag and a YAML key of the same name.

Values come from, in rising priority (``trl_ext.settings.layers``): the dataclass defaults, the command's
defaults, the preset the chosen options name (``ppo --backend scratch-grpo-quick``), ``--config FILE.yaml``,
flags; where each value came from travels with the options (``sources``). A YAML key that is not a field is
an error naming the key; a YAML value is converted to the field's type (YAML reads ``1e-3`` as a string) or
refused with the key named. Flags must be written out in full: argparse's abbreviations are off, so
``--step`` never stands for ``--steps``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path

from trl_ext.errors import InputError
from trl_ext.settings.fields import cli_fields
from trl_ext.settings.layers import COMMAND, DEFAULT, FLAG, YAML, Layer, resolve


class ConfigError(InputError):
    pass


def _arg_type(tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _arg_type(inner[0])
    return tp


NONE = object()  # a flag given as 'none': the option's None, told apart from a flag not given


def _or_none(tp):
    """``tp``'s parser that also reads 'none' (any case) as the option's None."""

    def parse(text: str):
        return NONE if str(text).lower() == "none" else tp(text)

    parse.__name__ = getattr(tp, "__name__", "value")  # argparse names it in its error
    return parse


def _bool(text: str) -> bool:
    lowered = str(text).lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"name\": 0.28}}', got {text!r}")
    return value


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
        if tp is dict:
            return value if isinstance(value, dict) else _json_object(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        raise ConfigError(f"option {key!r}: {value!r} is not a valid {tp.__name__}") from None
    return value


def _load_yaml(path: Path) -> dict:
    import yaml

    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)  # the one line an error shows names where the problem is
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}: {problem}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of option: value")
    return data


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """What every command returns: a one-line headline, the data behind it, and whether to print the data."""

    headline: str
    data: dict
    print_data: bool = False


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: option dataclasses combined by name (one per concern, as TRL's ``TrlParser`` combines
    its dataclasses), per-command defaults for some of their fields, the preset some options pick, and the
    function that runs it."""

    help: str
    parts: dict[str, type]
    run: typing.Callable[[typing.Any], CommandResult]
    defaults: dict = dataclasses.field(default_factory=dict)
    options: type = types.SimpleNamespace  # what holds the parts (and sources): a typed dataclass where it has one
    preset: typing.Callable[[dict], Layer | None] | None = None  # every option's value so far -> a preset layer

    @classmethod
    def for_options(cls, options: type, **rest) -> Command:
        """A command whose options are the typed dataclass ``options``, its parts that dataclass's (``parts_of``)."""
        return cls(parts=parts_of(options), options=options, **rest)

    def fields(self) -> dict[str, tuple[str, dataclasses.Field, typing.Any]]:
        """Every option name -> (its part, its field, its type); a name may appear in one part only."""
        out = {}
        for part, cls in self.parts.items():
            hints = typing.get_type_hints(cls)
            for f in cli_fields(cls):
                if f.name in out:
                    raise TypeError(f"option {f.name!r} is in both {out[f.name][0]!r} and {part!r}")
                out[f.name] = (part, f, _arg_type(hints[f.name]))
        unknown = set(self.defaults) - set(out)
        if unknown:
            raise TypeError(f"defaults for unknown options {sorted(unknown)}")
        return out

    def nullable(self, name: str) -> bool:
        """Whether option ``name`` takes None (its type is ``X | None``): its flag then reads 'none' as None."""
        part = self.fields()[name][0]
        return type(None) in typing.get_args(typing.get_type_hints(self.parts[part])[name])

    def default(self, name: str, f: dataclasses.Field):
        if name in self.defaults:
            return self.defaults[name]
        return None if f.default is dataclasses.MISSING else f.default

    def required(self, name: str, f: dataclasses.Field) -> bool:
        return (
            name not in self.defaults and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )


def add_command_arguments(parser: argparse.ArgumentParser, command: Command) -> None:
    parser.add_argument("--config", type=Path, default=None, help="YAML file of options (flags override it)")
    for name, (_, f, tp) in command.fields().items():
        flag = "--" + name.replace("_", "-")
        default = command.default(name, f)
        help_text = f.metadata.get("help", "") + ("" if command.required(name, f) else f" (default: {default})")
        choices = f.metadata.get("choices")
        if tp is bool:
            parser.add_argument(flag, dest=name, type=_bool, nargs="?", const=True, default=None, help=help_text)
        elif tp is dict:
            parser.add_argument(flag, dest=name, type=_json_object, default=None, help=help_text)
        else:  # a registry's names are open (module:name): its option's dataclass checks them
            parser.add_argument(
                flag,
                dest=name,
                type=_or_none(tp) if command.nullable(name) else tp,
                default=None,
                help=help_text,
                choices=None if isinstance(choices, Mapping) else choices,
            )


def parts_of(options: type) -> dict[str, type]:
    """A typed options dataclass as a command's parts: each option dataclass field's name and its type (the
    ``sources`` field beside them is no part)."""
    hints = typing.get_type_hints(options)
    return {f.name: hints[f.name] for f in dataclasses.fields(options) if dataclasses.is_dataclass(hints[f.name])}


def build_options(command: Command, namespace: argparse.Namespace):
    """The options the layers give (``trl_ext.settings.layers``: defaults, the command's, the preset the options so far
    pick, the YAML file, the flags given), one dataclass instance per part, and ``sources``: where each came from."""
    known = command.fields()
    given = {}
    if namespace.config is not None:
        for key, value in _load_yaml(namespace.config).items():
            name = str(key).replace("-", "_")
            if name not in known:
                close = difflib.get_close_matches(name, known, n=3)
                hint = f"did you mean {' or '.join(close)}?" if close else "`--help` lists the options"
                raise ConfigError(f"config file {str(namespace.config)!r}: unknown option {key!r} ({hint})")
            given[name] = convert_value(str(key), value, known[name][2])
    flags = {name: getattr(namespace, name) for name in known if getattr(namespace, name) is not None}
    flags = {name: None if value is NONE else value for name, value in flags.items()}
    layers = [Layer(COMMAND, command.defaults), Layer(YAML, given), Layer(FLAG, flags)]
    values, sources = resolve(layers)
    preset = None
    if command.preset is not None:  # the preset may hang on options the file or the flags set: read them first
        preset = command.preset({n: values.get(n, command.default(n, f)) for n, (_, f, _) in known.items()})
        if preset is not None:
            values, sources = resolve([*layers, preset])
    missing = [n for n, (_, f, _) in known.items() if n not in values and command.required(n, f)]
    if missing:
        raise ConfigError(f"missing required option(s): {', '.join('--' + m.replace('_', '-') for m in missing)}")
    parts = {
        part: cls(**{n: values[n] for n, (p, _, _) in known.items() if p == part and n in values})
        for part, cls in command.parts.items()
    }
    options = command.options(**parts, sources={n: sources.get(n, DEFAULT) for n in known})
    if hasattr(options, "inert_options"):  # the command knows which of its options its backend reads
        below = preset.values if preset is not None else {}
        changed = [  # what the user gave another value than the defaults and the preset had
            n
            for n, (_, f, _) in known.items()
            if sources.get(n) in (YAML, FLAG) and values[n] != below.get(n, command.default(n, f))
        ]
        refuse_inert(options.inert_options(changed), sources)
    return options


def refuse_inert(inert: dict[str, str], sources: dict) -> None:
    """One line naming each option the user gave that would change nothing (``inert``: name -> what it acts with),
    spelt as the user gave it."""
    if inert:
        said = [
            f"{'--' + n.replace('_', '-') if sources[n] == FLAG else n + ' (config file)'} acts only with {needs}"
            for n, needs in inert.items()
        ]
        one = len(said) == 1
        raise ConfigError(
            f"{'this option' if one else 'these options'} would change nothing: {'; '.join(said)}; "
            f"drop {'it' if one else 'them'}"
        )
