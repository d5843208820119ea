"""reasoning-gym's procedural tasks as prompt datasets in TRL's conversational format (``pip install
'trl-ext[reasoning-gym]'``); the reward that scores them is ``trl_ext.rewards.reasoning_gym``.

A spec names one task (``"chain_sum"``) or a weighted mix (``"chain_sum,basic_arithmetic"``,
``"chain_sum:2,basic_arithmetic:1"``), optionally after the ``reasoning-gym:`` prefix the command line uses. A mix is
reasoning-gym's own ``CompositeDataset``: each row draws its task by weight.

Each row holds ``prompt`` (a system prompt that asks for the answer format, then the question), ``task`` (the task
that generated it), ``task_config`` (the keyword arguments that rebuild that task's generator, whose ``score_answer``
may read its config), ``entry`` (the entry itself) and ``answer_format`` (how the reward reads the answer); the
``task_config`` and ``entry`` are JSON strings written by ``dumps_exact``, since entries hold tuples and dicts with int
keys that plain JSON would change.

Answer formats. ``"tags"`` (the default) is reasoning-gym's own: its system prompt asks for
``<answer>...</answer>`` and its ``extract_answer`` reads the last pair. ``"last-number"`` is for tasks whose answers
are numbers and models too small to write the tags (SmolLM2-135M-Instruct writes none, docs/public-tasks.md): the
system prompt asks for the answer as the reply's last number, and the reward reads that number.

Train and test streams. reasoning-gym seeds item ``i`` of a generator of seed ``s`` with ``s + i`` (a mix's
generators get ``s + 1``, ``s + 2``, ...). Train streams use seeds below ``TEST_SEED_OFFSET`` (2**31) and test
streams the same seeds plus it, so no train seed reaches a test stream's seeds; the 2**32 ceiling is numpy's
(``pool_matrix`` seeds numpy with ``s + i``). Distinct seeds can still make the same question, and at easy
settings they often do: ``trl_ext.data.reasoning_gym_splits`` keeps a test set's questions out of a train stream.
"""

from __future__ import annotations

import difflib
import importlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from trl_ext.errors import BackendUnavailableError, InputError

SPEC_PREFIX = "reasoning-gym:"
INSTALL_HINT = "pip install 'trl-ext[reasoning-gym]'"
TEST_SEED_OFFSET = 2**31
SPLITS = ("train", "test")
DEFAULT_SYSTEM_PROMPT = "default"  # a key of reasoning_gym.utils.SYSTEM_PROMPTS
ANSWER_FORMATS = ("tags", "last-number")
LAST_NUMBER_PROMPT = "Solve the problem. End your reply with the final answer: a number, and nothing after it."
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")  # 11, -7, 1,234, 0.25, 3.05e-05
BUILDER_ARGS = ("seed", "size")  # set by the builder, never by a task's config: they pick the stream
_TAG = "__exact__"  # marks a value plain JSON cannot hold: {"__exact__": kind, "items": [...]}


def import_reasoning_gym():
    """``reasoning_gym``, or one line saying how to install it."""
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError:
        raise BackendUnavailableError(
            f"reasoning-gym tasks need the reasoning_gym package, which is not installed here: {INSTALL_HINT}"
        ) from None


def task_names() -> list[str]:
    """Every task reasoning-gym registers ('composite' is its mixer, not a task)."""
    from reasoning_gym.factory import DATASETS

    return sorted(name for name in DATASETS if name != "composite")


@dataclass(frozen=True)
class MixPart:
    name: str
    weight: float
    config: dict  # the task's own generator settings (its Config dataclass's fields)


def parse_spec(spec: str, task_configs: Mapping[str, Mapping] | None = None) -> list[MixPart]:
    """``"a"``, ``"a,b"`` or ``"a:2,b:1"`` (an optional ``reasoning-gym:`` prefix first) -> the mix's parts."""
    import_reasoning_gym()
    if not isinstance(spec, str):
        raise InputError(f"reasoning-gym spec: expected a string such as 'chain_sum,basic_arithmetic', got {spec!r}")
    body = spec[len(SPEC_PREFIX) :] if spec.startswith(SPEC_PREFIX) else spec
    known, parts = task_names(), []
    for item in body.split(","):
        name, colon, weight_text = (s.strip() for s in item.partition(":"))
        if not name:
            raise InputError(
                f"reasoning-gym spec {spec!r}: empty task name (expected 'name' or 'name:weight', comma-separated)"
            )
        if name not in known:
            near = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {', '.join(near)}?" if near else f"{len(known)} tasks: {', '.join(known[:8])}, ..."
            raise InputError(f"reasoning-gym spec {spec!r}: unknown task {name!r}; {hint}")
        if any(p.name == name for p in parts):
            raise InputError(f"reasoning-gym spec {spec!r}: task {name!r} is named twice; give it one weight")
        parts.append(MixPart(name, _weight(spec, name, weight_text) if colon else 1.0, {}))
    return _with_configs(spec, parts, task_configs or {})


def _weight(spec: str, name: str, text: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if not (math.isfinite(weight) and weight > 0):
        raise InputError(
            f"reasoning-gym spec {spec!r}: task {name!r} has weight {text!r}; a weight is a positive number"
        )
    return weight


def _with_configs(spec: str, parts: list[MixPart], task_configs: Mapping[str, Mapping]) -> list[MixPart]:
    names = [p.name for p in parts]
    stray = sorted(set(task_configs) - set(names))
    if stray:
        raise InputError(f"reasoning-gym task_configs name {stray}, which the spec {spec!r} does not mix")
    for name, config in task_configs.items():
        if not isinstance(config, Mapping):
            raise InputError(f"reasoning-gym task_configs[{name!r}]: expected a dict of settings, got {config!r}")
        fixed = sorted(set(config) & set(BUILDER_ARGS))
        if fixed:
            raise InputError(
                f"reasoning-gym task_configs[{name!r}] sets {fixed}: seed and size come from the "
                "builder's seed, split and size"
            )
    return [MixPart(p.name, p.weight, dict(task_configs.get(p.name, {}))) for p in parts]


def stream_seed(seed: int, split: str) -> int:
    """The generator seed of ``split``'s stream: ``seed`` for train, ``seed + TEST_SEED_OFFSET`` for test."""
    if split not in SPLITS:
        raise InputError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    return seed + (TEST_SEED_OFFSET if split == "test" else 0)


def _check_stream(seed: int, size: int, tasks: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"reasoning-gym dataset size must be a positive integer, got {size!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"reasoning-gym seed must be a non-negative integer, got {seed!r}")
    if seed + size + tasks > TEST_SEED_OFFSET:  # the stream's largest generator seed must stay below the test range
        raise InputError(
            f"reasoning-gym seed {seed} with size {size}: seed + size + {tasks} (tasks) must stay "
            f"within 2**31, where the test streams begin"
        )


def _generator(parts: list[MixPart], seed: int, size: int):
    """reasoning-gym's dataset for the parts (the task's own, or its ``CompositeDataset`` for a mix), and the
    generator of each task (a mix's rows come from its sub-generators: each row is scored by the one that made it)."""
    import reasoning_gym
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    try:
        if len(parts) == 1:
            generator = reasoning_gym.create_dataset(parts[0].name, seed=seed, size=size, **parts[0].config)
            return generator, {parts[0].name: generator}
        specs = [DatasetSpec(p.name, p.weight, dict(p.config)) for p in parts]
        generator = CompositeDataset(CompositeConfig(size=size, seed=seed, datasets=specs))
        return generator, generator.datasets
    except (TypeError, ValueError, AssertionError) as err:  # its Config dataclasses refuse by assert
        names = ", ".join(p.name for p in parts)
        raise InputError(
            f"reasoning-gym task {names}: its config was refused ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'a setting is out of range'})"
        ) from None


def generator_kwargs(part: MixPart, generator) -> dict:
    """What ``reasoning_gym.create_dataset(part.name, **kwargs)`` rebuilds ``generator`` from: the part's own
    settings, and the seed and size it was made with (a mix gives each task a seed of its own)."""
    return {**part.config, "seed": generator.config.seed, "size": generator.config.size}


def system_prompt_text(system_prompt: str | None) -> str | None:
    """The text of one of reasoning-gym's ``SYSTEM_PROMPTS`` (None: no system message)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if system_prompt is None:
        return None
    if system_prompt not in SYSTEM_PROMPTS:
        raise InputError(
            f"system_prompt must be one of reasoning-gym's {', '.join(sorted(SYSTEM_PROMPTS))} (or "
            f"None); got {system_prompt!r}"
        )
    return SYSTEM_PROMPTS[system_prompt]


def last_number(text: str) -> str | None:
    """The last number in ``text`` (thousands commas dropped), or None: the ``"last-number"`` format's answer."""
    found = NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def _system_message(system_prompt: str | None, answer_format: str) -> str | None:
    if answer_format not in ANSWER_FORMATS:
        raise InputError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}; got {answer_format!r}")
    if answer_format == "tags":
        return system_prompt_text(system_prompt)
    if system_prompt not in (None, DEFAULT_SYSTEM_PROMPT):  # every reasoning-gym prompt asks for the tags instead
        raise InputError(
            f"answer_format {answer_format!r} brings its own system prompt; system_prompt {system_prompt!r} asks "
            "for <answer> tags: leave it at its default"
        )
    return LAST_NUMBER_PROMPT


def _check_numeric(entry: dict, task: str) -> None:
    if last_number(str(entry["answer"])) != str(entry["answer"]).replace(",", ""):
        raise InputError(
            f"reasoning-gym task {task!r} answers {str(entry['answer'])[:40]!r}, not a number: answer_format "
            "'last-number' cannot read it; use 'tags'"
        )


def reasoning_gym_dataset(
    spec: str,
    size: int,
    seed: int = 0,
    split: str = "train",
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    task_configs: Mapping[str, Mapping] | None = None,
    answer_format: str = "tags",
):
    """``size`` rows of a reasoning-gym task or mix as a ``datasets.Dataset``: ``prompt`` (conversational),
    ``task``, ``task_config``, ``entry`` and ``answer_format`` (what ``trl_ext.rewards.reasoning_gym`` scores with).

    ``seed`` and ``split`` pick the stream (the module docstring: train and test never share a generator seed);
    ``task_configs``: per task, its generator's settings (e.g. ``{"chain_sum": {"max_terms": 3}}``);
    ``answer_format``: ``"tags"`` or ``"last-number"`` (the module docstring).
    """
    from datasets import Dataset

    parts = parse_spec(spec, task_configs)
    _check_stream(seed, size, len(parts))
    system = _system_message(system_prompt, answer_format)
    generator, sources = _generator(parts, stream_seed(seed, split), size)
    configs = {p.name: dumps_exact(generator_kwargs(p, sources[p.name]), p.name) for p in parts}
    rows: dict[str, list] = {"prompt": [], "task": [], "task_config": [], "entry": []}
    for index in range(size):
        entry = generator[index]
        task = entry["metadata"]["source_dataset"]
        if answer_format == "last-number":
            _check_numeric(entry, task)
        question = [{"role": "user", "content": entry["question"]}]
        rows["prompt"].append(question if system is None else [{"role": "system", "content": system}, *question])
        rows["task"].append(task)
        rows["task_config"].append(configs[task])
        rows["entry"].append(dumps_exact(entry, task))
    rows["answer_format"] = [answer_format] * size
    return Dataset.from_dict(rows)


def question_texts(
    spec: str, size: int, seed: int = 0, split: str = "train", task_configs: Mapping[str, Mapping] | None = None
) -> list[str]:
    """The question (the user turn's text) of each of the first ``size`` items of ``reasoning_gym_dataset``'s stream
    of ``seed`` and ``split``: the same items, without building rows."""
    parts = parse_spec(spec, task_configs)
    _check_stream(seed, size, len(parts))
    generator, _ = _generator(parts, stream_seed(seed, split), size)
    return [generator[index]["question"] for index in range(size)]


def dumps_exact(value, task: str) -> str:
    """JSON that ``loads_exact`` turns back into an equal value: tuples, sets, fractions and dicts with non-string
    keys are tagged rather than turned into lists and string keys; numpy scalars become their Python values."""
    try:
        return json.dumps(_tagged(value), ensure_ascii=False)
    except TypeError as err:
        raise InputError(
            f"reasoning-gym task {task!r}: its entries or settings hold {err}, which cannot be stored "
            "in a dataset column"
        ) from None


def loads_exact(text: str):
    return _untagged(json.loads(text))


def _tagged(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_tagged(v) for v in value]
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [_tagged(v) for v in value]}
    if isinstance(value, (set, frozenset)):  # sorted by repr so the same set always writes the same text
        return {_TAG: type(value).__name__, "items": [_tagged(v) for v in sorted(value, key=repr)]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and _TAG not in value:
            return {k: _tagged(v) for k, v in value.items()}
        return {_TAG: "dict", "items": [[_tagged(k), _tagged(v)] for k, v in value.items()]}
    if isinstance(value, Fraction):  # gsm_symbolic's variables
        return {_TAG: "Fraction", "items": [value.numerator, value.denominator]}
    if type(value).__module__ == "numpy" and hasattr(value, "item"):  # numpy.int64, ... (numpy.str_ is a str)
        return _tagged(value.item())
    raise TypeError(f"a {type(value).__module__}.{type(value).__qualname__}")


_UNTAG = {"tuple": tuple, "set": set, "frozenset": frozenset, "Fraction": lambda items: Fraction(*items)}


def _untagged(value):
    if isinstance(value, list):
        return [_untagged(v) for v in value]
    if not isinstance(value, dict):
        return value
    if _TAG in value:
        items = value["items"]
        if value[_TAG] == "dict":
            return {_untagged(k): _untagged(v) for k, v in items}
        return _UNTAG[value[_TAG]](_untagged(v) for v in items)
    return {k: _untagged(v) for k, v in value.items()}
