"""The warm start (``rlhf --warm-start-games N``): games played by a scripted player that makes legal moves at
random, written as SFT rows, so that a short SFT teaches the model the game's move format but not its strategy:
the strategy is what RL must find, and the warm-started model's win rate starts near the random player's.

The player of GuessTheNumber (GEM's ``game:GuessTheNumber-v0-*``, TextArena's ``GuessTheNumber-v0*``) guesses a
number of the game's range (read from its first observation: "between A and B") that it has not guessed yet, in
the game's format (GEM's ``\\boxed{7}``, TextArena's ``[7]``), and never reads the hints. Measured on the first 200
test games of seed 0 (``random_player_rates(spec, 200, 0)``; over 3000 games in brackets): GEM's easy game (1-10,
4 turns) wins 0.365 (0.405; 4 distinct guesses of 10: 0.4 in expectation), mean return 0.741; its hard one (1-50,
7 turns) 0.11 (0.138); TextArena's GuessTheNumber-v0 (1-20, 10 turns) 0.545 (0.534).

A game is rows of TRL's prompt/completion conversations, one a move: the prompt is the game so far (its
observations as user turns, the moves before as assistant turns), the completion the move (the SFT stage's loss is
on the completion only).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from trl_ext.errors import InputError
from trl_ext.runs.play import Move, play_scripted, rates

RANGE = re.compile(r"between (\d+) and (\d+)")
MOVE_FORMATS = {"gem": "\\boxed{{{}}}", "textarena": "[{}]"}


def guess_the_number(move_format: str) -> Move:
    """A random legal guess: a number of the range the first observation states, not guessed before."""
    pattern = re.compile(re.escape(move_format.format("NUMBER")).replace("NUMBER", r"(\d+)"))

    def move(conversation: list[dict], rng: random.Random) -> str:
        found = RANGE.search(conversation[0]["content"])
        if found is None:
            raise InputError(
                f"the random player found no range in the game's first observation {conversation[0]!r:.120}"
            )
        low, high = int(found.group(1)), int(found.group(2))
        guessed = {int(g) for m in conversation if m["role"] == "assistant" for g in pattern.findall(m["content"])}
        left = [n for n in range(low, high + 1) if n not in guessed] or list(range(low, high + 1))
        return move_format.format(rng.choice(left))

    return move


def random_player(spec: str) -> Move:
    """The random player of the environment ``spec`` names, or one line saying which games have one."""
    package, _, name = spec.partition(":")
    if package in MOVE_FORMATS and "GuessTheNumber" in name:
        return guess_the_number(MOVE_FORMATS[package])
    raise InputError(
        f"no random player for {spec}: the warm start plays GuessTheNumber "
        "(gem:game:GuessTheNumber-v0-easy, textarena:GuessTheNumber-v0, ...)"
    )


def warm_start_rows(spec: str, games: int, seed: int = 0, max_turns: int | None = None) -> list[dict]:
    """The SFT rows of ``games`` train games of ``seed`` (seeds ``seed + i``) played by the random player: one a
    move, its prompt the game so far and its completion the move."""
    from trl_ext.agents.public_environments import environment_factory, game_seeds

    _, conversations = play_scripted(
        environment_factory(spec), game_seeds(games, seed), random_player(spec), seed, max_turns
    )
    return [
        {"prompt": conversation[:k], "completion": [conversation[k]]}
        for conversation in conversations
        for k, message in enumerate(conversation)
        if message["role"] == "assistant"
    ]


def random_player_rates(
    spec: str,
    games: int,
    seed: int = 0,
    split: str = "test",
    max_turns: int | None = None,
    factory: Callable | None = None,
) -> dict:
    """The random player's ``rates`` (games, win rate, mean return, mean turns) on the first ``games`` games of
    ``split``'s stream of ``seed``."""
    from trl_ext.agents.public_environments import environment_factory, game_seeds

    factory = factory or environment_factory(spec)
    outcomes, _ = play_scripted(factory, game_seeds(games, seed, split), random_player(spec), seed, max_turns)
    return rates(outcomes)
