"""Named functions of one kind (advantage estimators, KL estimators, policy losses), filled by decorators.

verl's ``register_adv_est`` is the model: a user adds an algorithm by decorating a function, and the
config offers the name at once (its ``choices`` are the live registry). Names are never replaced: a
second registration of a name is an error, so no test has to restore a registry it changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from trl_ext.errors import InputError


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
        try:
            return self._entries[name]
        except KeyError:
            raise InputError(f"unknown {self.kind} {name!r}: known are {', '.join(self._entries)}") from None

    def __contains__(self, name) -> bool:  # Mapping's would call __getitem__, which raises ValueError
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
