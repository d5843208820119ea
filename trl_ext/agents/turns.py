"""The turn loop of a batch of multi-turn rollouts, token in and token out, as TRL's GRPOTrainer runs its tool
loop: sample a turn for every rollout still going; hand it to the rollout's other side (its tools, or a
``step()`` environment); append what that side says, as the chat template renders it after the assistant turn, to
the ids already sampled; sample the next turn from there. Earlier turns are never re-tokenized.

The other side is anything with ``answer(tokenizer, ids, query, trajectory) -> Answer``: a ``Toolbox`` runs the
turn's tool calls (``ToolSide``), a step environment plays its move (``trl_ext.agents.steps.StepSide``). A
rollout ends when its side says nothing back (a turn that calls no tool or whose call cannot be parsed, an episode
that terminated or was truncated), after ``max_iterations`` rounds of tool calls, or when what the side says would
overflow the one token budget of all its turns (it is dropped, as TRL drops a tool result, and counted);
``turn_tokens`` caps each turn on its own. A turn cut before its eos that the conversation goes on from is closed
with the eos the template would render (context, not trained).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from trl_ext.agents import templates
from trl_ext.agents.tools import Toolbox, ToolCounts
from trl_ext.agents.trajectory import Trajectory

# sample(queries, max_new_tokens) -> (each query's new ids up to and including eos, their log-probs or None)
SampleFn = Callable[[list[list[int]], int], tuple[list[list[int]], list[list[float]] | None]]


@dataclass
class Answer:
    """What the other side makes of one model turn."""

    message: dict  # the model's turn as a message (parsed tool calls, or its text)
    reward: float = 0.0  # that turn's reward (its tools' ``ToolResult`` rewards, the environment's step reward)
    messages: list[dict] = field(default_factory=list)  # the side's reply (tool results, an observation); []: done
    suffix: list[int] = field(default_factory=list)  # their tokens after the turn's eos, to the next turn's header


class OtherSide(Protocol):
    def answer(self, tokenizer, ids: list[int], query: list[int], trajectory: Trajectory) -> Answer: ...

    def dropped(self) -> None:
        """Its reply did not fit (the budget or the context): the rollout ends here."""


@dataclass
class ToolSide:
    """The tool loop's other side: the rollout's tools, run where its turn calls them (at most ``max_iterations``
    rounds), their faults results the model reads, counted in ``counts``."""

    toolbox: Toolbox
    counts: ToolCounts
    max_iterations: int

    def answer(self, tokenizer, ids: list[int], query: list[int], trajectory: Trajectory) -> Answer:
        message, malformed = templates.parse_turn(tokenizer, ids, query, self.toolbox.tools)
        self.counts.malformed += malformed
        calls = message.get("tool_calls")
        if not calls or trajectory.tool_rounds >= self.max_iterations:
            return Answer(message)
        results = [self.toolbox.call(call, self.counts) for call in calls]
        tool_messages = [m for m, _ in results]
        reward = sum(r for _, r in results)
        return Answer(message, reward, tool_messages, templates.tool_suffix_ids(tokenizer, tool_messages))

    def dropped(self) -> None:
        """TRL rolls these results back and ends the rollout (``run_turns`` counts them)."""


def run_turns(
    sample: SampleFn,
    tokenizer,
    prompt_ids: list[list[int]],
    sides: Sequence[Toolbox | OtherSide],
    budget: int,
    max_iterations: int | None = None,
    max_positions: int | None = None,
    turn_tokens: int | None = None,
) -> tuple[list[Trajectory], ToolCounts]:
    """Roll out every prompt to its end; ``sides``: each rollout's other side (a ``Toolbox``: its tools);
    ``budget`` tokens per completion for all turns and what the sides say together (``response_length``);
    ``turn_tokens`` at most for one turn (None: the budget's room); ``max_positions`` the model's context, which no
    query may reach. The counts are the tools', and the replies dropped (``overlong``) whatever the side."""
    iterations = sys.maxsize if max_iterations is None else max_iterations
    max_positions = sys.maxsize if max_positions is None else max_positions
    counts = ToolCounts()
    players = [ToolSide(s, counts, iterations) if isinstance(s, Toolbox) else s for s in sides]
    trajectories = [Trajectory(list(ids)) for ids in prompt_ids]
    active = list(range(len(trajectories)))
    while active:
        active = [i for i in active if len(trajectories[i].ids) < budget]  # a reply that filled the budget: done
        if not active:
            break
        queries = [trajectories[i].prompt_ids + trajectories[i].ids for i in active]
        room = [min(budget - len(trajectories[i].ids), turn_tokens or sys.maxsize) for i in active]
        new_ids, new_logprobs = sample(queries, max(room))
        going = []
        for k, i in enumerate(active):
            t, ids = trajectories[i], new_ids[k][: room[k]]  # one budget: cut where this rollout's room ends
            logprobs = None if new_logprobs is None else new_logprobs[k][: len(ids)]
            t.add_model_turn(ids, logprobs)
            answer = players[i].answer(tokenizer, ids, queries[k], t)
            t.messages.append(answer.message)
            t.add_turn_reward(answer.reward)  # the side did act on the turn: it keeps its reward, whatever follows
            if not answer.messages:
                continue
            suffix = ([] if ids and ids[-1] == tokenizer.eos_token_id else [tokenizer.eos_token_id]) + answer.suffix
            if len(t.ids) + len(suffix) > budget or len(t.prompt_ids) + len(t.ids) + len(suffix) >= max_positions:
                counts.overlong += 1
                players[i].dropped()
                continue
            t.add_environment_turn(suffix, answer.messages)
            t.tool_rounds += 1
            going.append(i)
        active = going
    return trajectories, counts
