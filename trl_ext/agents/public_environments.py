"""Public multi-turn environments by name, as public tasks are named: ``gem:game:GuessTheNumber-v0-easy`` (GEM, "A
Gym for Agentic LLMs", ``gem-llm``) and ``textarena:GuessTheNumber-v0`` (TextArena), each adapted to the Gym
protocol the ``step_environment`` rollout plays (``trl_ext.agents.steps``).

- GEM already speaks it: ``reset(seed) -> (observation, info)``, ``step(text) -> (observation, reward, terminated,
  truncated, info)``; an observation after a step is followed by the game's ``info["suffix"]`` ("Enter your next
  guess."), as GEM's ``concat`` observation wrapper writes it.
- TextArena: ``reset(num_players=1, seed)``, ``get_observation()`` (the messages since the last one: the game's,
  not the player's echoed move), ``step(text) -> (done, info)``, the one reward at ``close()``: it becomes the
  reward of the turn that ended the game (``terminated``). The named environment's action wrappers apply (its
  ``[move]`` formatting); its observation wrappers, which repeat the whole history each turn, do not: the
  conversation holds the history.

Seeds (``game_seeds``): game ``i`` of the train stream of ``seed`` is played with ``seed + i``, of the test stream
with ``seed + 2**31 + i`` (``TEST_SEED_OFFSET``, as ``trl_ext.data.reasoning_gym`` splits its streams): no train
game is a test game. An unknown name is refused with its close names, an environment that needs the network (an nltk
download, a hub dataset, a hosted model) in one line, before anything is written.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import logging
from typing import Any

from trl_ext.data.reasoning_gym import TEST_SEED_OFFSET
from trl_ext.errors import BackendUnavailableError, InputError

PACKAGES = {  # the prefix -> (the module, how to install it)
    "gem": ("gem", "pip install 'trl-ext[gem]' && pip install --no-deps gem-llm (gem-llm pins an older reasoning-gym)"),
    "textarena": ("textarena", "pip install 'trl-ext[textarena]'"),
}
SPLITS = ("train", "test")
# GEM's games that read nltk's word list (downloaded on first use), and its sets that load a hub dataset
GEM_NLTK_GAMES = ("game:Wordle", "game:Hangman", "game:WordSearch")
GEM_HUB_PREFIXES = ("math:", "code:", "qa:", "logic:")
# TextArena's games that download nltk data or call a hosted model when made or played
TEXTARENA_NETWORK = {
    **dict.fromkeys(
        ("Hangman", "Wordle", "WordLadder", "WordSearch", "WordChains", "LetterAuction", "DontSayIt", "Codenames"),
        "an nltk download",
    ),
    "SpellingBee": "an nltk download",
    **dict.fromkeys(("GuessWho", "TwentyQuestions", "Debate", "ScenarioPlanning"), "a hosted model (an API key)"),
}


def is_public_environment(spec: str | None) -> bool:
    """Whether ``spec`` names a public environment (``gem:NAME``, ``textarena:NAME``) rather than user code."""
    return bool(spec) and str(spec).split(":", 1)[0] in PACKAGES


def parse(spec: str) -> tuple[str, str]:
    """``"gem:game:GuessTheNumber-v0-easy"`` -> ``("gem", "game:GuessTheNumber-v0-easy")``."""
    package, _, name = spec.partition(":")
    if package not in PACKAGES or not name:
        raise InputError(
            f"environment {spec!r}: expected 'gem:NAME' (e.g. gem:game:GuessTheNumber-v0-easy) or "
            "'textarena:NAME' (e.g. textarena:GuessTheNumber-v0)"
        )
    return package, name


def _import(package: str):
    """The package, or one line saying how to install it. ``import gem`` configures the root logger (INFO, to
    stderr): put back as it was, so that a run's output stays its own."""
    module, install = PACKAGES[package]
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return importlib.import_module(module)
    except ImportError as error:
        needs = f"{package} environments need the {module} package ({error}): {install}"
        raise BackendUnavailableError(needs) from None
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)


def known_names(package: str) -> list[str]:
    """The environments ``package`` registers (the names ``gem.make`` / ``textarena.make`` take)."""
    _import(package)
    registry = importlib.import_module("gem.envs.registration" if package == "gem" else "textarena.envs.registration")
    return list(registry.ENV_REGISTRY)


def _nltk_words_present() -> bool:
    try:
        import nltk

        nltk.data.find("corpora/words")
        return True
    except (ImportError, LookupError):
        return False


def offline_refusal(package: str, name: str) -> str | None:
    """Why ``package``'s ``name`` cannot run offline, or None."""
    if package == "gem":
        if name.startswith(GEM_HUB_PREFIXES):
            return "loads its dataset from the Hugging Face hub"
        if name.startswith(GEM_NLTK_GAMES) and not _nltk_words_present():
            return "reads nltk's word list, a download (python -m nltk.downloader words)"
        return None
    why = TEXTARENA_NETWORK.get(name.split("-v", 1)[0])
    return f"needs {why}" if why else None


def check_environment(spec: str) -> tuple[str, str]:
    """``(package, name)`` of a public environment that runs here, or one line: the package missing, the name
    unknown (its close names), the environment needing the network, or it failing to make and reset a game."""
    package, name = parse(spec)
    names = known_names(package)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f"; close names: {', '.join(f'{package}:{c}' for c in close)}" if close else ""
        raise InputError(f"unknown {package} environment {name!r}{hint}")
    why = offline_refusal(package, name)
    if why:
        raise InputError(f"environment {spec} {why}: not offline; trl-ext trains environments that run offline")
    try:
        make(package, name).reset(seed=0)
    except Exception as error:  # a game that needs something else (more players, a key): said before any stage
        raise InputError(f"environment {spec} could not be made and reset: {type(error).__name__}: {error}") from None
    return package, name


WIN_REWARD = 1.0  # GEM's ``LanguageGameReward.success_reward``; TextArena's ``set_outcome(reward=1)`` of a win


class GemGame:
    """A GEM environment in the Gym protocol (it speaks it): the observation after a step with GEM's suffix.
    ``won``: the game's own win, GEM's success reward (1) on a step that ``terminated`` the game, not
    ``truncated`` (GuessTheNumber pays it on the guess that hits; a miss on the last turn is both flags and a
    partial score below 1)."""

    def __init__(self, name: str):
        gem = _import("gem")
        self.name, self.env, self.won = name, gem.make(name), False

    def reset(self, seed: int, **_) -> tuple[str, dict]:
        self.won = False
        return self.env.reset(seed=int(seed))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.won = bool(terminated and not truncated and float(reward) >= WIN_REWARD)
        suffix = info.get("suffix") if isinstance(info, dict) else None
        if suffix and not (terminated or truncated):
            observation = f"{observation.rstrip()}\n{suffix}"
        return observation, float(reward), bool(terminated), bool(truncated), info


class TextArenaGame:
    """A single-player TextArena game in the Gym protocol: its reward at ``close()`` is the last turn's. ``won``:
    that reward is TextArena's win (1; its other outcomes pay the share of the game completed, below 1)."""

    def __init__(self, name: str):
        textarena = _import("textarena")
        self.name, self.env, self.won = name, textarena.make(name), False
        self.core = self.env
        while hasattr(self.core, "env"):  # the game under its wrappers: its messages, not the wrapped history
            self.core = self.core.env

    def _messages(self) -> str:
        player, messages = self.core.get_observation()
        if isinstance(messages, str):
            return messages
        return "\n".join(str(m[1]) for m in messages if m[0] != player)  # (sender, text, kind): not the echo

    def reset(self, seed: int, **_) -> tuple[str, dict]:
        self.won = False
        self.env.reset(num_players=1, seed=int(seed))
        return self._messages(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        done, info = self.env.step(action)
        observation = self._messages()
        if not done:
            return observation, 0.0, False, False, info or {}
        closed = self.env.close()
        rewards = closed[0] if isinstance(closed, tuple) else closed
        reward = float((rewards or {}).get(0, 0.0))
        self.won = reward >= WIN_REWARD
        return observation, reward, True, False, info or {}


def make(package: str, name: str) -> Any:
    return GemGame(name) if package == "gem" else TextArenaGame(name)


def environment_factory(spec: str):
    """A picklable factory of ``spec``'s environment (checked first: ``check_environment``)."""
    package, name = check_environment(spec)
    return functools.partial(GemGame if package == "gem" else TextArenaGame, name)


def game_seeds(size: int, seed: int = 0, split: str = "train") -> list[int]:
    """The seeds of the first ``size`` games of ``split``'s stream of ``seed``: ``seed + i`` for train, plus
    ``TEST_SEED_OFFSET`` for test (below it, no train seed reaches a test seed)."""
    if split not in SPLITS:
        raise InputError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0 or seed + size > TEST_SEED_OFFSET:
        raise InputError(f"game seeds: seed {seed!r} with {size} games must stay in [0, 2**31), where tests begin")
    start = seed + (TEST_SEED_OFFSET if split == "test" else 0)
    return list(range(start, start + size))


def game_rows(size: int, seed: int = 0, split: str = "train") -> dict[str, list]:
    """``size`` games as dataset columns: an empty user turn each (the rollout writes the game's first
    observation into it) and the game's ``seed``."""
    return game_rows_of(game_seeds(size, seed, split))


def game_rows_of(seeds: list[int]) -> dict[str, list]:
    """The games of ``seeds`` as dataset columns (``game_rows``)."""
    return {"prompt": [[{"role": "user", "content": ""}] for _ in seeds], "seed": list(seeds)}
