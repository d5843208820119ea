"""One multi-turn rollout as it grows turn by turn: the completion ids (the model's turns and what the other side
said between them: tool results, an environment's observations), the loss mask (the model's own tokens), the
sampler's log-probs, and the per-turn rewards on each turn's last token (``trl_ext.rollouts.trajectories`` makes a
batch of them the trainer's record)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Trajectory:
    """One rollout: ``prompt_ids`` then ``ids``, of which ``loss_mask`` marks the model's tokens."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # the completion: model turns and tool results, in order
    loss_mask: list[int] = field(default_factory=list)  # 1 on tokens the policy sampled, 0 on tool results
    logprobs: list[float] | None = field(default_factory=list)  # the sampler's, 0.0 on tool results; None: unknown
    messages: list[dict] = field(default_factory=list)  # TRL's completion: assistant turns and tool messages
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)  # (the turn's last token in ids, reward)
    model_turns: int = 0
    tool_rounds: int = 0  # rounds the other side answered (tool results, an environment's observations)

    def add_model_turn(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.loss_mask += [1] * len(ids)
        self.model_turns += 1
        if self.logprobs is not None:
            self.logprobs = None if logprobs is None else self.logprobs + list(logprobs)

    def add_turn_reward(self, reward: float) -> None:
        """A reward for the last model turn, on its last token."""
        if reward:
            self.turn_rewards.append((len(self.ids) - 1, reward))

    def add_environment_turn(self, suffix: list[int], messages: list[dict]) -> None:
        """What the environment says after the last model turn (tool results, an observation as a user turn): its
        tokens, context only, and its messages."""
        self.ids += suffix
        self.loss_mask += [0] * len(suffix)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(suffix)
        self.messages += messages

    @property
    def model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def environment_tokens(self) -> int:
        return len(self.ids) - self.model_tokens
