"""One multi-turn rollout as it grows turn by turn, and a batch of them as the trainer's tensors: the completion
ids (the model's turns and the tool results between them), the loss mask (the model's own tokens) apart from the
attention mask (every completion token), the sampler's log-probs, and the per-turn rewards on each turn's last
token."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trl_ext.data.batching import pad_batch


@dataclass
class Trajectory:
    """One rollout: ``prompt_ids`` then ``ids``, of which ``model_mask`` marks the model's tokens."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # the completion: model turns and tool results, in order
    model_mask: list[int] = field(default_factory=list)  # 1 on tokens the policy sampled, 0 on tool results
    logprobs: list[float] | None = field(default_factory=list)  # the sampler's, 0.0 on tool results; None: unknown
    messages: list[dict] = field(default_factory=list)  # TRL's completion: assistant turns and tool messages
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)  # (the turn's last token in ids, reward)
    model_turns: int = 0
    tool_rounds: int = 0

    def add_model_turn(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.model_mask += [1] * len(ids)
        self.model_turns += 1
        if self.logprobs is not None:
            self.logprobs = None if logprobs is None else self.logprobs + list(logprobs)

    def add_turn_reward(self, reward: float) -> None:
        """A reward for the last model turn, on its last token."""
        if reward:
            self.turn_rewards.append((len(self.ids) - 1, reward))

    def add_tool_results(self, suffix: list[int], messages: list[dict], reward: float) -> None:
        """The tool messages after the last model turn: their tokens (context only) and that turn's reward."""
        self.add_turn_reward(reward)
        self.ids += suffix
        self.model_mask += [0] * len(suffix)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(suffix)
        self.messages += messages
        self.tool_rounds += 1

    @property
    def model_tokens(self) -> int:
        return sum(self.model_mask)

    @property
    def environment_tokens(self) -> int:
        return len(self.ids) - self.model_tokens


@dataclass
class TrajectoryBatch:
    """A batch of rollouts as tensors on one device, each ``(B, R)`` unless noted."""

    query_ids: torch.Tensor  # (B, P) left-padded prompts
    query_mask: torch.Tensor  # (B, P)
    responses: torch.Tensor  # the completions, right-padded
    loss_mask: torch.Tensor  # 1 on the model's own tokens
    attention: torch.Tensor  # 1 on every completion token, tool results included
    turn_rewards: torch.Tensor  # per-turn rewards on each turn's last token, 0 elsewhere
    sampling_logprobs: torch.Tensor | None  # the sampler's log-probs where every rollout knows them


def to_batch(trajectories: list[Trajectory], pad_token_id: int, device) -> TrajectoryBatch:
    query_ids, query_mask = pad_batch([t.prompt_ids for t in trajectories], pad_token_id, side="left")
    responses, attention = pad_batch([t.ids for t in trajectories], pad_token_id, side="right")
    loss_mask, _ = pad_batch([t.model_mask for t in trajectories], 0, side="right")
    turn_rewards = torch.zeros(responses.shape, dtype=torch.float32)
    for row, t in enumerate(trajectories):
        for position, reward in t.turn_rewards:
            turn_rewards[row, position] += reward
    sampling = None
    if all(t.logprobs is not None for t in trajectories):
        sampling = torch.zeros(responses.shape, dtype=torch.float32)
        for row, t in enumerate(trajectories):
            sampling[row, :len(t.logprobs)] = torch.tensor(t.logprobs, dtype=torch.float32)
        sampling = sampling.to(device)
    return TrajectoryBatch(query_ids.to(device), query_mask.to(device), responses.to(device),
                           loss_mask.to(device).long(), attention.to(device).long(), turn_rewards.to(device), sampling)
