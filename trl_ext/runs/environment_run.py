"""A public environment's part of an ``rlhf`` run (``--environment gem:NAME``): its train games as the prompts, the
warm start's games (a random player's, as SFT rows) and the held-out play of its test games."""

from __future__ import annotations

import json
from pathlib import Path

from trl_ext.agents.options import AgentOptions
from trl_ext.data.prompt_files import PromptFile
from trl_ext.runs.environment_eval import EnvironmentEval
from trl_ext.runs.rlhf_options import RLHFOptions


def environment_prompts(agents: AgentOptions, seed: int) -> tuple[PromptFile, list[str]]:
    """A public environment's train games of ``seed`` as a prompt file (an empty user turn the rollout writes the
    game's first observation into, and the game's ``seed`` column), and the line saying so."""
    from trl_ext.agents.public_environments import game_rows

    rows = game_rows(agents.environment_games, seed, "train")
    lines = list(range(1, agents.environment_games + 1))
    prompts = PromptFile(str(agents.environment), lines, rows["prompt"], {"seed": rows["seed"]}, "conversational")
    first, last = rows["seed"][0], rows["seed"][-1]
    said = (
        f"[prompts] {agents.environment_games} train games of {agents.environment} (seeds {first}-{last}; "
        "its test games are seeded from 2**31 on), played turn by turn: observations as user turns"
    )
    return prompts, [said]


def warm_start_data(opts: RLHFOptions, out: Path, say) -> str:
    """``--warm-start-games`` train games of ``--environment`` played by its random player, written as SFT rows to
    ``out/warm_start/games.jsonl`` (the same file for the same options: the SFT stage is reused)."""
    from trl_ext.runs.random_players import warm_start_rows

    environment, games = str(opts.agents.environment), opts.stages.warm_start_games
    rows = warm_start_rows(environment, games, opts.train.seed, opts.agents.environment_turns)
    path = out / "warm_start" / "games.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    say(f"[warm-start] {games} train games of {environment} played by a random player: {len(rows)} moves in {path}")
    return str(path)


def environment_evaluation(opts: RLHFOptions, rollout) -> EnvironmentEval:
    """``--environment-eval-games``' test games, played as ``rollout`` (the run's) plays them."""
    return EnvironmentEval(
        str(opts.agents.environment),
        rollout.factory,
        opts.train.seed,
        opts.agents.environment_eval_games,
        opts.train.response_length,
        opts.train.temperature,
        rollout.max_turns,
        rollout.max_turn_tokens,
    )
