"""Multi-turn trajectories (``trl_ext.agents.trajectory``) as the one record: the completion ids (the model's turns
and the environment's tokens between them), the loss mask (the model's own tokens) apart from the attention mask
(every completion token), the sampler's log-probs, the per-turn rewards on each turn's last token, and the turn
and tool counters behind the rollout metrics."""

from __future__ import annotations

import torch

from trl_ext.agents.tools import ToolCounts
from trl_ext.agents.trajectory import Trajectory
from trl_ext.data.batching import pad_batch
from trl_ext.rollouts.record import RolloutBatch

# metric -> (counter, the counter it is divided by; None: the count itself): TRL's tools/* names where TRL has one
TURN_RATES: dict[str, tuple[str, str | None]] = {
    "tokens/model_per_rollout": ("model_tokens", "rollouts"),
    "tokens/environment_per_rollout": ("environment_tokens", "rollouts"),
    "turns/per_rollout": ("turns", "rollouts"),
    "turns/reward_per_rollout": ("turn_rewards", "rollouts"),
}
TOOL_RATES: dict[str, tuple[str, str | None]] = {
    "tools/call_frequency": ("calls", "rollouts"),
    "tools/failure_frequency": ("failures", "calls"),
    "tools/unknown_calls": ("unknown", None),
    "tools/malformed_calls": ("malformed", None),
    "tools/dropped_results": ("overlong", None),
}


def trajectories_record(
    trajectories: list[Trajectory],
    prompts: list,
    pad_token_id: int,
    device,
    counts: ToolCounts | None = None,
    columns: dict | None = None,
) -> RolloutBatch:
    """The batch's record; ``counts``: the tool calls' (None: no tools, no tools/* metrics)."""
    query_ids, query_mask = pad_batch([t.prompt_ids for t in trajectories], pad_token_id, side="left")
    responses, attention = pad_batch([t.ids for t in trajectories], pad_token_id, side="right")
    loss_mask, _ = pad_batch([t.loss_mask for t in trajectories], 0, side="right")
    turn_rewards = torch.zeros(responses.shape, dtype=torch.float32)
    for row, t in enumerate(trajectories):
        for position, reward in t.turn_rewards:
            turn_rewards[row, position] += reward
    sampling = None
    known = [t.logprobs for t in trajectories if t.logprobs is not None]
    if len(known) == len(trajectories):
        sampling = torch.zeros(responses.shape, dtype=torch.float32)
        for row, logprobs in enumerate(known):
            sampling[row, : len(logprobs)] = torch.tensor(logprobs, dtype=torch.float32)
        sampling = sampling.to(device)
    counters = {
        "rollouts": len(trajectories),
        "turns": sum(t.model_turns for t in trajectories),
        "model_tokens": sum(t.model_tokens for t in trajectories),
        "environment_tokens": sum(t.environment_tokens for t in trajectories),
        "turn_rewards": sum(r for t in trajectories for _, r in t.turn_rewards),
    }
    rates = dict(TURN_RATES)
    if counts is not None:
        counters.update(
            calls=counts.calls,
            failures=counts.failures,
            unknown=counts.unknown,
            malformed=counts.malformed,
            overlong=counts.overlong,
        )
        rates.update(TOOL_RATES)
    return RolloutBatch(
        query_ids.to(device),
        query_mask.to(device),
        responses.to(device),
        loss_mask=loss_mask.to(device).long(),
        attention_mask=attention.to(device).long(),
        prompts=prompts,
        completions=[t.messages for t in trajectories],
        completion_ids=[t.ids for t in trajectories],
        sampling_logprobs=sampling,
        turn_rewards=turn_rewards.to(device),
        columns=columns or {},
        counters=counters,
        rates=rates,
    )
