"""Where each setting of a run comes from: layers of values applied in order, each value's source recorded.

The order, lowest first: the option field's default, the command's default, a named preset (a backend's or an
estimator's, ``trl_ext.tasks.doubling.presets``), the YAML file, the flags. A later layer's value replaces an earlier
one's, so what the user gave (the file, the flags) is never replaced by a preset. The sources go into the run's
``summary.json`` (``"sources": {"learning_rate": "flag", "kl_coef": "preset grpo-quick", ...}``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

DEFAULT, COMMAND, PRESET, YAML, FLAG = "default", "command default", "preset", "yaml", "flag"
ORDER = (DEFAULT, COMMAND, PRESET, YAML, FLAG)


@dataclass(frozen=True)
class Layer:
    """Some options' values and where they come from."""

    source: str  # one of ORDER; a preset's is "preset NAME"
    values: dict


def preset_layer(name: str, values: dict) -> Layer:
    return Layer(f"{PRESET} {name}", dict(values))


def rank(source: str) -> int:
    """A source's place in ORDER (a preset's by its kind)."""
    return ORDER.index(PRESET if source.startswith(PRESET + " ") else source)


def resolve(layers: Iterable[Layer]) -> tuple[dict, dict]:
    """The values of ``layers``, each layer applied over those before it, and the source of each value."""
    values, sources = {}, {}
    for layer in sorted(layers, key=lambda layer: rank(layer.source)):  # stable: equal ranks keep their order
        for name, value in layer.values.items():
            values[name], sources[name] = value, layer.source
    return values, sources


def under_user(preset: Layer, values: dict, sources: dict) -> tuple[dict, dict]:
    """``values`` (``sources``: where each came from, absent meaning a default) with ``preset`` applied in its
    place: its values replace those of the defaults, never those of the YAML file or the flags."""
    taken = {
        name: value for name, value in preset.values.items() if rank(sources.get(name, DEFAULT)) < rank(preset.source)
    }
    return {**values, **taken}, {**sources, **{name: preset.source for name in taken}}


@dataclass
class CommandOptions:
    """What a command takes: its subclass adds a part per concern (each part's fields are flags of the command);
    ``sources`` holds where each option's value came from (keyword-only, so the parts after it need no default)."""

    sources: dict = field(default_factory=dict, kw_only=True)  # option -> its layer's source
