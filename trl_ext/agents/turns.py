"""The turn loop of a batch of multi-turn rollouts, token in and token out, as TRL's GRPOTrainer runs its tool
loop: sample a turn for every rollout still going; parse it; execute its tool calls; append the tool messages'
tokens (as the chat template renders them after the assistant turn) to the ids already sampled; sample the next
turn from there. Earlier turns are never re-tokenized.

A rollout ends when its turn calls no tool (or its call cannot be parsed), after ``max_iterations`` rounds of
tool calls, or when the next tool result would overflow the one token budget of all its turns (that result is
dropped, as TRL drops it, and counted).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from trl_ext.agents import templates
from trl_ext.agents.tools import Toolbox, ToolCounts
from trl_ext.agents.trajectory import Trajectory

# sample(queries, max_new_tokens) -> (each query's new ids up to and including eos, their log-probs or None)
SampleFn = Callable[[list[list[int]], int], tuple[list[list[int]], list[list[float]] | None]]


def run_turns(
    sample: SampleFn,
    tokenizer,
    prompt_ids: list[list[int]],
    toolboxes: list[Toolbox],
    budget: int,
    max_iterations: int | None = None,
    max_positions: int | None = None,
) -> tuple[list[Trajectory], ToolCounts]:
    """Roll out every prompt to its end; ``budget`` tokens per completion for all turns and tool results
    together (``response_length``); ``max_positions`` the model's context, which no query may reach."""
    max_iterations = sys.maxsize if max_iterations is None else max_iterations
    max_positions = sys.maxsize if max_positions is None else max_positions
    trajectories = [Trajectory(list(ids)) for ids in prompt_ids]
    counts = ToolCounts()
    active = list(range(len(trajectories)))
    while active:
        active = [i for i in active if len(trajectories[i].ids) < budget]  # a result that filled the budget: done
        if not active:
            break
        queries = [trajectories[i].prompt_ids + trajectories[i].ids for i in active]
        room = [budget - len(trajectories[i].ids) for i in active]
        new_ids, new_logprobs = sample(queries, max(room))
        going = []
        for k, i in enumerate(active):
            t, ids = trajectories[i], new_ids[k][: room[k]]  # one budget: cut where this rollout's room ends
            logprobs = None if new_logprobs is None else new_logprobs[k][: len(ids)]
            message, malformed = templates.parse_turn(tokenizer, ids, queries[k], toolboxes[i].tools)
            t.add_model_turn(ids, logprobs)
            t.messages.append(message)
            counts.malformed += malformed
            calls = message.get("tool_calls")
            if not calls or t.tool_rounds >= max_iterations:
                continue
            results = [toolboxes[i].call(call, counts) for call in calls]
            tool_messages = [m for m, _ in results]
            suffix = templates.tool_suffix_ids(tokenizer, tool_messages)
            if len(t.ids) + len(suffix) > budget or len(t.prompt_ids) + len(t.ids) + len(suffix) >= max_positions:
                counts.overlong += 1  # TRL rolls these results back and ends the rollout
                t.add_turn_reward(sum(r for _, r in results))  # the tools did run: the calling turn keeps its reward
                continue
            t.add_tool_results(suffix, tool_messages, sum(r for _, r in results))
            going.append(i)
        active = going
    return trajectories, counts
