"""Games of a ``step()`` environment played outside training, to score a player: a model (``play_with_model``,
greedy or sampled, through the ``step_environment`` rollout the run trains with: the same prompt, token cap a turn,
turn cap and budget) or a scripted player (``play_scripted``: a function of the conversation so far to a move).

Each game ends as an ``Outcome``: its return (the sum of its steps' rewards), whether it was won, its turns. Won is
the game's own signal, read from the environment after its last step (``won``: ``GemGame`` and ``TextArenaGame``
in ``trl_ext.agents.public_environments`` say what they read); an environment without one is never won.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

from trl_ext.agents.steps import StepSide, reset_observation, step_once

Move = Callable[[list[dict], random.Random], str]  # (the conversation so far, a generator) -> the next move


@dataclass(frozen=True)
class Outcome:
    """One game as it ended."""

    episode_return: float  # the sum of its steps' rewards
    won: bool  # the game's own win signal (``won`` on the environment)
    turns: int  # the moves made


def rates(outcomes: Sequence[Outcome]) -> dict:
    """``{"games", "win_rate", "mean_return", "mean_turns"}`` of ``outcomes`` (4 decimals)."""
    n = max(1, len(outcomes))
    return {
        "games": len(outcomes),
        "win_rate": round(sum(o.won for o in outcomes) / n, 4),
        "mean_return": round(sum(o.episode_return for o in outcomes) / n, 4),
        "mean_turns": round(sum(o.turns for o in outcomes) / n, 4),
    }


def won(environment) -> bool:
    return bool(getattr(environment, "won", False))


def play_scripted(
    environment_factory: Callable, seeds: Sequence[int], move: Move, seed: int = 0, max_turns: int | None = None
) -> tuple[list[Outcome], list[list[dict]]]:
    """The games of ``seeds`` played by ``move`` (drawing from ``random.Random(seed)``): their outcomes and their
    conversations (the first observation and each later one as user turns, the moves as assistant turns)."""
    rng, outcomes, conversations = random.Random(seed), [], []
    environment = environment_factory()
    for game_seed in seeds:
        side = StepSide(environment, max_turns)
        conversation = [{"role": "user", "content": reset_observation(environment, {"seed": game_seed})}]
        while True:
            action = move(conversation, rng)
            conversation.append({"role": "assistant", "content": action})
            observation, reward, side.terminated, truncated = step_once(environment, action)
            side.rewards.append(reward)
            if side.terminated or truncated or (max_turns is not None and len(side.rewards) >= max_turns):
                break
            conversation.append({"role": "user", "content": observation})
        outcomes.append(Outcome(side.episode_return, won(environment), len(side.rewards)))
        conversations.append(conversation)
    return outcomes, conversations


class ModelSampling:
    """The ``Sampling`` a rollout gets (``trl_ext.rollouts.base``), made of a model alone: the KV-cache loop
    engine, greedy at ``temperature`` 0, else sampled from the whole distribution with a generator of ``seed``."""

    def __init__(self, model, tokenizer, response_length: int, temperature: float = 0.0, seed: int = 0):
        import torch

        from trl_ext.data.prompt_dataset import max_positions

        self.model, self.tokenizer, self.trainer = model, tokenizer, None
        self.device = next(model.parameters()).device
        self.max_positions = max_positions(model)
        self.config = SimpleNamespace(
            response_length=response_length,
            num_generations=1,
            skip_special_tokens=True,
            score_position="last_token",
            max_tool_calling_iterations=None,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            repetition_penalty=1.0,
        )
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def pad(self, queries):
        from trl_ext.data.batching import pad_batch

        ids, mask = pad_batch([list(q) for q in queries], self.tokenizer.pad_token_id, side="left")
        return ids.to(self.device), mask.to(self.device)

    def sample(self, query_ids, query_mask, max_new_tokens: int | None = None):
        import dataclasses

        from trl_ext.ppo.rollout.interface import Completions, SamplingOptions, trimmed
        from trl_ext.ppo.rollout.loop import sample_responses

        options = SamplingOptions.of(self.config, self.tokenizer)
        if max_new_tokens is not None:
            options = dataclasses.replace(options, max_new_tokens=max_new_tokens)
        ids = sample_responses(self.model, query_ids, query_mask, options, self.generator)
        return trimmed(Completions(ids), self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)


def play_with_model(
    model,
    tokenizer,
    environment_factory: Callable,
    seeds: Sequence[int],
    *,
    response_length: int,
    temperature: float = 0.0,
    seed: int = 0,
    max_turns: int | None = None,
    max_turn_tokens: int | None = None,
    batch_size: int = 32,
) -> list[Outcome]:
    """The games of ``seeds`` played by ``model`` through the ``step_environment`` rollout (``batch_size`` games at
    a time), in eval mode (no dropout), greedy at ``temperature`` 0."""
    from trl_ext.agents.public_environments import game_rows_of
    from trl_ext.rollouts.step_environment import StepEnvironment

    rollout = StepEnvironment(environment_factory, max_turns, max_turn_tokens, rewards="final")
    sampling = ModelSampling(model, tokenizer, response_length, temperature, seed)
    was_training, outcomes = model.training, []
    model.eval()
    try:
        for start in range(0, len(seeds), batch_size):
            batch = rollout.rollout(game_rows_of(list(seeds[start : start + batch_size])), sampling)
            for completion, episode_return, environment in zip(
                batch.completions, batch.columns["environment_reward"], batch.columns["environments"]
            ):
                turns = sum(m["role"] == "assistant" for m in completion)
                outcomes.append(Outcome(float(episode_return), won(environment), turns))
    finally:
        model.train(was_training)
    return outcomes
