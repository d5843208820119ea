"""``trl-ext rlhf --environment gem:NAME --environment-eval-games N``: the policy plays the first N test games of the
environment (seeds from ``--seed + 2**31``: no train game is one, ``public_environments.game_seeds``) before
training (the policy as loaded: the warm start's, if any, no adapter yet) and after (the trained policy, its
adapter on), greedy and sampled at the run's temperature, through the rollout the run trains with (its token cap a
turn and turn cap); the random player's games on the same seeds beside them where the game has one
(``runs.random_players``). Win rate, mean return and mean turns each, in ``environment_eval.json`` and
``summary.json``'s ``games.test``.

A game is won on the game's own signal (``won`` of ``GemGame``/``TextArenaGame``: GEM's success reward on the step
that ended the game, TextArena's win outcome); the return is the sum of its steps' rewards (for GEM's
GuessTheNumber the partial score of a last guess that missed is in it: read the win rate for wins).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trl_ext.errors import InputError

PHASES = ("before", "after")


@dataclass
class EnvironmentEval:
    """One run's held-out games: which, how they are played, and the rates so far."""

    environment: str
    factory: Callable
    seed: int
    games: int
    response_length: int
    temperature: float  # the sampled games'; the greedy ones are at 0
    max_turns: int | None = None
    max_turn_tokens: int | None = None
    results: dict[str, dict] = field(default_factory=dict)  # phase -> {"greedy": rates, "sampled": rates}
    random_player: dict | None = None  # the random player's rates on the same games (None: the game has none)

    @property
    def seeds(self) -> list[int]:
        from trl_ext.agents.public_environments import game_seeds

        return game_seeds(self.games, self.seed, "test")

    def play_random(self) -> None:
        """The random player's rates on the same games, where the game has a random player."""
        from trl_ext.runs.random_players import random_player_rates

        try:
            self.random_player = random_player_rates(
                self.environment, self.games, self.seed, max_turns=self.max_turns, factory=self.factory
            )
        except InputError:  # no random player for this game: nothing to set beside
            self.random_player = None

    def play(self, phase: str, model, tokenizer) -> dict:
        """``model``'s rates on the test games, greedy and sampled (seeded by the run's seed), kept as ``phase``."""
        from trl_ext.runs.play import play_with_model, rates

        def played(temperature: float) -> dict:
            outcomes = play_with_model(
                model,
                tokenizer,
                self.factory,
                self.seeds,
                response_length=self.response_length,
                temperature=temperature,
                seed=self.seed,
                max_turns=self.max_turns,
                max_turn_tokens=self.max_turn_tokens,
            )
            return rates(outcomes)

        self.results[phase] = {"greedy": played(0.0), "sampled": played(self.temperature)}
        return self.results[phase]

    def line(self, phase: str) -> str:
        greedy, sampled = self.results[phase]["greedy"], self.results[phase]["sampled"]
        random = self.random_player
        beside = f"; the random player's {random['win_rate']}" if random and phase == "before" else ""
        return (
            f"[environment-eval] {phase} training: win rate {greedy['win_rate']} greedy, {sampled['win_rate']} "
            f"sampled (T={self.temperature:g}), mean return {greedy['mean_return']} / {sampled['mean_return']}, "
            f"on the first {self.games} test games of {self.environment}{beside}"
        )

    def record(self) -> dict:
        return {
            "environment": self.environment,
            "split": "test",
            "games": self.games,
            "seeds_from": self.seeds[0] if self.games else None,
            "temperature": self.temperature,
            "random_player": self.random_player,
            **{phase: self.results.get(phase) for phase in PHASES},
        }

    def write(self, out: Path) -> None:
        (out / "environment_eval.json").write_text(json.dumps(self.record(), indent=2) + "\n")
