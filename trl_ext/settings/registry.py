"""Named functions of one kind (samplers, advantage estimators, policy losses, KL estimators and shapings), filled by
decorators.

verl's ``register_adv_est`` is the model: a user adds an algorithm by decorating a function, and the
config offers the name at once (its ``choices`` are the live registry). Names are never replaced: a
second registration of a name is an error, so no test has to restore a registry it changed.

A name may also be user code, ``"module:name"`` or ``"file.py:name"`` (as ``--reward-fn`` names a reward): looking
it up imports the module. A function the module registered is found under its registered name as well; one it did
not register is registered under the ``module:name`` itself, with the registry's default properties.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from trl_ext.errors import InputError
from trl_ext.settings.user_code import import_callable, is_user_code


@dataclass(frozen=True)
class Entry:
    """A registered function and what the trainer must know about it (``needs_values``, ...)."""

    fn: Callable
    properties: dict = field(default_factory=dict)

    def __getattr__(self, name):
        try:
            return self.properties[name]
        except KeyError:
            raise AttributeError(name) from None


class Registry(Mapping):
    """``@registry.register("name", key=value, ...)`` adds a function; ``registry["name"]`` is its ``Entry``."""

    def __init__(self, kind: str, **default_properties):
        self.kind = kind
        self._defaults = default_properties
        self._entries: dict[str, Entry] = {}
        self._user_code: dict[str, Entry] = {}  # "module:name" -> the entry it names, registered there or here

    def register(self, name: str, **properties) -> Callable[[Callable], Callable]:
        unknown = set(properties) - set(self._defaults)
        if unknown:
            raise TypeError(f"{self.kind} takes the properties {sorted(self._defaults)}, not {sorted(unknown)}")
        if name in self._entries:
            raise InputError(f"{self.kind} {name!r} is already registered")

        def add(fn: Callable) -> Callable:
            self._entries[name] = Entry(fn, {**self._defaults, **properties})
            return fn

        return add

    def __getitem__(self, name: str) -> Entry:
        if name in self._entries:
            return self._entries[name]
        if isinstance(name, str) and is_user_code(name):
            return self._from_user_code(name)
        raise InputError(
            f"unknown {self.kind} {name!r}: known are {', '.join(self._entries)}, or your own as "
            "'module:name' or 'file.py:name'"
        )

    def _from_user_code(self, spec: str) -> Entry:
        if spec not in self._user_code:
            fn = import_callable(spec, self.kind)
            registered = [entry for entry in self._entries.values() if entry.fn is fn]
            self._user_code[spec] = registered[0] if registered else Entry(fn, dict(self._defaults))
        return self._user_code[spec]

    def __contains__(self, name) -> bool:  # Mapping's would call __getitem__, which raises ValueError
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
