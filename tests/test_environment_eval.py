"""Held-out games and the warm start of a public environment: the random player makes legal moves at random in the
game's format and wins about its share of GEM's games; its games become SFT rows, one a move; a model plays the
test games greedy (the same every time) and sampled through the rollout the run trains with; ``rlhf --environment
... --warm-start-games N --environment-eval-games M`` warm starts, plays before and after, and records it; the
options are refused where they mean nothing, in one line. Skipped without gem (``scripts/setup.sh latest``)."""

import json
import re

import pytest
from test_public_environments import _rlhf, policy  # noqa: F401  (the module's tiny policy fixture)

from trl_ext.agents.public_environments import environment_factory, game_seeds
from trl_ext.errors import InputError
from trl_ext.runs.play import play_scripted, play_with_model, rates
from trl_ext.runs.random_players import random_player, random_player_rates, warm_start_rows

GEM = "gem:game:GuessTheNumber-v0-easy"  # 1-10, 4 turns
MOVE = re.compile(r"^\\boxed\{(\d+)\}$")


@pytest.fixture(autouse=True)
def gem():
    pytest.importorskip("gem")


def test_the_random_player_guesses_legal_numbers_and_wins_its_share():
    outcomes, games = play_scripted(environment_factory(GEM), game_seeds(200, 0, "test"), random_player(GEM))
    for game in games:
        guesses = [int(MOVE.match(m["content"]).group(1)) for m in game if m["role"] == "assistant"]
        assert all(1 <= g <= 10 for g in guesses) and len(set(guesses)) == len(guesses)  # legal, never twice
    won = [o for o in outcomes if o.won]
    # a win is GEM's success reward on the guess that hit: the last one, and the game ended there
    assert all(g[-1]["content"] == f"\\boxed{{{g[-1]['content'][7:-1]}}}" for g in games)
    assert all(o.episode_return == 1.0 for o in won) and all(o.episode_return < 1.0 for o in outcomes if not o.won)
    measured = rates(outcomes)
    assert measured == random_player_rates(GEM, 200, 0)  # the same games, the same draws
    assert 0.3 <= measured["win_rate"] <= 0.45  # measured 0.365: 4 distinct guesses of 10 win 0.4 in expectation


def test_warm_start_rows_are_the_random_players_moves_one_a_row():
    rows = warm_start_rows(GEM, 8, seed=3)
    assert rows == warm_start_rows(GEM, 8, seed=3) and rows != warm_start_rows(GEM, 8, seed=4)
    firsts = [r for r in rows if len(r["prompt"]) == 1]
    assert len(firsts) == 8 and all("Guess The Number" in r["prompt"][0]["content"] for r in firsts)
    for row in rows:
        roles = [m["role"] for m in row["prompt"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]  # observations as user turns
        [move] = row["completion"]
        assert move["role"] == "assistant" and MOVE.match(move["content"])
        earlier = {m["content"] for m in row["prompt"] if m["role"] == "assistant"}
        assert move["content"] not in earlier


def test_a_game_without_a_random_player_is_refused_in_one_line():
    with pytest.raises(InputError, match="no random player for gem:game:Mastermind-v0-easy"):
        random_player("gem:game:Mastermind-v0-easy")


def test_a_model_plays_the_test_games_greedy_the_same_every_time():
    from trl_ext.tasks.toy_game import game_model, game_tokenizer

    tok = game_tokenizer()
    model = game_model(tok).train()
    seeds, factory = game_seeds(6, 0, "test"), environment_factory(GEM)

    def play(temperature, seed=0):
        return play_with_model(
            model, tok, factory, seeds, response_length=64, temperature=temperature, seed=seed, max_turn_tokens=4
        )

    greedy = play(0.0)
    assert len(greedy) == 6 and greedy == play(0.0, seed=1)
    assert play(1.0) == play(1.0) and all(1 <= o.turns <= 4 for o in greedy + play(1.0))
    assert model.training  # played in eval mode (no dropout), then left as it was
    # a random model rarely writes \boxed{}: GEM's format penalty, which ends the game on turn 1
    assert all(o.episode_return == -0.1 and o.turns == 1 for o in greedy if not o.won)


def test_rlhf_warm_starts_and_plays_test_games_before_and_after(policy, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "o"
    extra = ["--warm-start-games", "4", "--sft-steps", "2", "--environment-eval-games", "3", "--seed", "2"]
    assert _rlhf(policy, out, "--environment", GEM, *extra) == 0, capsys.readouterr().err[-2000:]
    said = capsys.readouterr().out
    assert "[warm-start] 4 train games of gem:game:GuessTheNumber-v0-easy played by a random player" in said
    assert "[environment-eval] before training: win rate" in said and "the random player's" in said
    rows = [json.loads(line) for line in (out / "warm_start" / "games.jsonl").read_text().splitlines()]
    assert rows == warm_start_rows(GEM, 4, seed=2)
    test = json.loads((out / "summary.json").read_text())["games"]["test"]
    assert test == json.loads((out / "environment_eval.json").read_text())
    assert test["games"] == 3 and test["seeds_from"] == 2 + 2**31
    assert test["random_player"] == random_player_rates(GEM, 3, 2)
    for phase in ("before", "after"):
        for mode in ("greedy", "sampled"):
            assert test[phase][mode]["games"] == 3 and 0.0 <= test[phase][mode]["win_rate"] <= 1.0
    assert "test win rate (sampled)" in said  # the run's last line


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prompts", "p.txt", "--warm-start-games", "4"], "--warm-start-games plays a public environment's games"),
        (["--prompts", "p.txt", "--environment-eval-games", "4"], "--environment-eval-games plays a public"),
        (["--environment", GEM, "--warm-start-games", "4", "--sft-data", "s.jsonl"], "not both"),
        (["--environment", "gem:game:Mastermind-v0-easy", "--warm-start-games", "4"], "no random player"),
    ],
)
def test_the_options_are_refused_where_they_mean_nothing(policy, tmp_path, capsys, extra, message):  # noqa: F811
    from trl_ext.commands.cli import main

    out = tmp_path / "o"
    assert main(["rlhf", "--policy", str(policy), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not out.exists(), err
