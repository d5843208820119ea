"""The single-turn rollout: each prompt's one completion, sampled in one call of the rollout engine."""

from __future__ import annotations

from trl_ext.data.prompt_dataset import check_context
from trl_ext.data.sequences import completion_token_ids
from trl_ext.errors import InputError
from trl_ext.rewards.scoring import as_completions
from trl_ext.rollouts.base import ROLLOUTS, Rollout, Sampling
from trl_ext.rollouts.record import RolloutBatch


@ROLLOUTS.register("single_turn")
class SingleTurn(Rollout):
    """Prompt in, one completion out (the default): the loss mask is the response mask."""

    def check(self, config, tokenizer) -> None:
        if config.max_tool_calling_iterations is not None:
            raise InputError(
                "max_tool_calling_iterations bounds the tool calls of a multi-turn rollout (tools, "
                "environment_factory); this run's rollout is single-turn: give tools or drop it"
            )

    def rollout(self, rows: dict, sampling: Sampling) -> RolloutBatch:
        tokenizer = sampling.tokenizer
        query_ids, query_mask = sampling.pad(rows["input_ids"])
        longest = int(query_mask.sum(1).max()) if len(query_mask) else 0
        check_context(longest, sampling.config.response_length, sampling.max_positions, "a batch's prompts")
        responses, mask, logprobs = sampling.sample(query_ids, query_mask)
        prompts = rows.get("prompt") or tokenizer.batch_decode(rows["input_ids"])
        completion_ids = completion_token_ids(responses, mask)
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=sampling.config.skip_special_tokens)
        return RolloutBatch(
            query_ids,
            query_mask,
            responses,
            loss_mask=mask,
            attention_mask=mask,
            prompts=prompts,
            completions=as_completions(prompts, texts),
            completion_ids=completion_ids,
            sampling_logprobs=logprobs,
        )
