"""The tool loop as a rollout (TRL GRPOTrainer's ``tools`` and ``environment_factory``, with its meanings): each
environment reset with its row, the prompt rendered with the rollout's tools, then ``agents.turns.run_turns``
samples turn after turn and appends the tool results' tokens between them.

An environment with ``get_reward()`` brings it as one more reward function (``reward_funcs``, weight 1): declared
here, when the rollout is built.
"""

from __future__ import annotations

from collections.abc import Callable

from trl_ext.agents import templates
from trl_ext.agents.environments import EnvironmentPool
from trl_ext.agents.tools import Toolbox, check_tools, environment_tools
from trl_ext.agents.turns import SampleFn, run_turns
from trl_ext.data.sequences import completion_token_ids, is_conversation
from trl_ext.errors import InputError
from trl_ext.rollouts.base import Rollout, Sampling
from trl_ext.rollouts.record import RolloutBatch
from trl_ext.rollouts.trajectories import trajectories_record

NOT_RESET_ARGUMENTS = ("input_ids", "attention_mask")  # trl-ext's tokenized prompt: no column of the user's rows


def check_multi_turn(config) -> None:
    """Settings no multi-turn rollout trains with."""
    if config.score_position != "last_token":
        raise InputError(
            "multi-turn rollouts need score_position='last_token': the position after a response "
            "is no model token when the environment spoke last"
        )


def conversations(prompts: list) -> list[list[dict]]:
    if not all(is_conversation(p) for p in prompts):
        raise InputError(
            "tools and environments need conversational prompts (lists of {'role', 'content'} "
            "messages): the chat template renders the tools and the tool results"
        )
    return [list(p) for p in prompts]


def turn_sampler(sampling: Sampling) -> SampleFn:
    """One turn for each query with the trainer's engine: its new ids up to eos, and the engine's log-probs."""

    def sample(queries: list[list[int]], max_new_tokens: int):
        responses, mask, logprobs = sampling.sample(*sampling.pad(queries), max_new_tokens=max_new_tokens)
        ids = completion_token_ids(responses, mask)
        if logprobs is None:
            return ids, None
        return ids, [row[: len(i)] for row, i in zip(logprobs.tolist(), ids)]

    return sample


class ToolLoop(Rollout):
    """Tools and environments: the model's turns with the tools' results between them."""

    def __init__(self, tools: list[Callable] | None = None, environment_factory: Callable | None = None):
        if tools is not None and not isinstance(tools, (list, tuple)):  # one function given alone
            raise InputError(f"tools must be a list of functions, got {type(tools).__name__}: tools=[{tools!r:.40}]")
        self.tools = list(tools or [])
        self.pool = EnvironmentPool(environment_factory) if environment_factory is not None else None
        check_tools(self.tools + self.pool.probe_tools() if self.pool else self.tools)
        self.reward_funcs = [self.pool.reward_function()] if self.pool is not None and self.pool.has_reward else []

    def check(self, config, tokenizer) -> None:
        check_multi_turn(config)
        templates.prepare_tokenizer(tokenizer)

    def rollout(self, rows: dict, sampling: Sampling) -> RolloutBatch:
        tokenizer = sampling.tokenizer
        size = len(rows["input_ids"])
        prompts = conversations(rows.get("prompt") or tokenizer.batch_decode(rows["input_ids"]))
        environments, columns = None, {}
        if self.pool is not None:
            environments = columns["environments"] = self.pool.take(size)
            row_dicts = [{k: v[i] for k, v in rows.items() if k not in NOT_RESET_ARGUMENTS} for i in range(size)]
            prompts = self.pool.reset(environments, row_dicts, prompts)
        toolboxes = [
            Toolbox(self.tools + (environment_tools(e) if e is not None else []))
            for e in (environments or [None] * size)
        ]
        prompt_ids = [templates.prompt_ids(tokenizer, p, box.tools) for p, box in zip(prompts, toolboxes)]
        trajectories, counts = run_turns(
            turn_sampler(sampling),
            tokenizer,
            prompt_ids,
            toolboxes,
            sampling.config.response_length,
            sampling.config.max_tool_calling_iterations,
            sampling.max_positions,
        )
        return trajectories_record(trajectories, prompts, tokenizer.pad_token_id, sampling.device, counts, columns)
