"""Reward functions as the reward *model* TRL's PPOTrainer accepts.

TRL's PPO never calls a reward function: ``trl.experimental.utils.get_reward`` runs
``getattr(model, model.base_model_prefix)(input_ids=..., attention_mask=..., ...)``, then
``model.score(hidden_states[-1])`` and reads the score at the last non-pad token. The module
below plays that part: its "backbone" decodes each row, splits it into prompt and completion,
calls the reward function and writes the reward at every position; ``score`` is the identity.

The split point (TRL's ``context_length``) never reaches the backbone, so the adapter finds
each prompt itself: every sequence must start with one of the prompts it was given (the PPO
training dataset), and that prompt's other dataset columns are passed to the reward function
too, as GRPO would pass them. When the dataset's ``prompt`` column holds conversations, the reward
function gets that conversation and the completion as one assistant message, as GRPO and the scratch
trainer hand them. Completions are decoded as the scratch trainer decodes them: special tokens (the eos)
dropped unless ``skip_special_tokens`` is False (``PPOConfig.skip_special_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace

import torch
from torch import nn

from trl_ext.data.sequences import is_conversation
from trl_ext.rewards.base import RewardError, call_reward, reward_name


class PromptIndex:
    """Token-id prompts -> their dataset columns, found by the longest matching prefix."""

    def __init__(
        self,
        prompt_ids: Sequence[Sequence[int]],
        columns: dict[str, list] | None = None,
        conversations: list | None = None,
    ):
        if len(prompt_ids) == 0:
            raise RewardError("the prompt index needs at least one prompt")
        self.rows = {tuple(ids): i for i, ids in enumerate(prompt_ids)}
        self.lengths = sorted({len(ids) for ids in prompt_ids}, reverse=True)
        self.columns = {k: list(v) for k, v in (columns or {}).items()}
        self.conversations = conversations  # the rows' conversational prompts, handed on as GRPO hands them

    @classmethod
    def from_dataset(cls, dataset, exclude: Sequence[str] = ("input_ids", "attention_mask", "prompt")):
        columns = {c: dataset[c] for c in dataset.column_names if c not in exclude}
        prompts = dataset["prompt"] if "prompt" in dataset.column_names else None
        return cls(dataset["input_ids"], columns, prompts if prompts and is_conversation(prompts[0]) else None)

    def find(self, ids: Sequence[int]) -> tuple[int, int]:
        """Return ``(prompt_length, row)`` of the longest known prompt that ``ids`` starts with."""
        for length in self.lengths:
            row = self.rows.get(tuple(ids[:length]))
            if row is not None:
                return length, row
        raise RewardError(f"sequence {list(ids)[:32]} does not start with any prompt of the PPO dataset")


class _RewardBackbone(nn.Module):
    def __init__(self, reward_fn: Callable, tokenizer, index: PromptIndex, skip_special_tokens: bool):
        super().__init__()
        self.reward_fn, self.tokenizer, self.index = reward_fn, tokenizer, index
        self.skip_special_tokens = skip_special_tokens
        self.register_buffer("anchor", torch.zeros(0), persistent=False)  # follows .to(device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_ignored):
        if attention_mask is None:
            attention_mask = input_ids != self.tokenizer.pad_token_id
        prompts, completions, rows = [], [], []
        for ids, mask in zip(input_ids.tolist(), attention_mask.bool().tolist()):
            real = [t for t, keep in zip(ids, mask) if keep]  # TRL replaced pads by 0: trust the mask
            length, row = self.index.find(real)
            completion = self.tokenizer.decode(real[length:], skip_special_tokens=self.skip_special_tokens)
            if self.index.conversations is not None:  # what the scratch trainer hands: one assistant message
                prompts.append(self.index.conversations[row])
                completions.append([{"role": "assistant", "content": completion}])
            else:
                prompts.append(self.tokenizer.decode(real[:length], skip_special_tokens=False))
                completions.append(completion)
            rows.append(row)
        columns = {name: [values[r] for r in rows] for name, values in self.index.columns.items()}
        rewards = call_reward(self.reward_fn, prompts, completions, **columns)
        scores = torch.tensor(rewards, dtype=torch.float32, device=input_ids.device)
        return SimpleNamespace(hidden_states=(scores[:, None, None].expand(-1, input_ids.shape[1], 1),))


class RewardFunctionModel(nn.Module):
    """An ``nn.Module`` with ``base_model_prefix`` and ``score``: a reward function in TRL PPO's shape."""

    base_model_prefix = "reward_backbone"

    def __init__(self, reward_fn: Callable, tokenizer, index: PromptIndex, skip_special_tokens: bool = True):
        super().__init__()
        self.reward_backbone = _RewardBackbone(reward_fn, tokenizer, index, skip_special_tokens)
        self.score = nn.Identity()
        self.name = reward_name(reward_fn)


def as_ppo_reward_model(
    reward_fn: Callable, tokenizer, prompts, skip_special_tokens: bool = True
) -> RewardFunctionModel:
    """Wrap ``reward_fn`` for ``trl.experimental.ppo.PPOTrainer(reward_model=...)``.

    ``prompts``: the PPO ``train_dataset`` (its ``input_ids`` and other columns are indexed)
    or a list of token-id lists. ``skip_special_tokens``: completions decoded without the eos and other special
    tokens (GRPO's way, the default) or with them, for a reward that reads the eos.
    """
    if not callable(reward_fn):
        raise RewardError(f"reward_fn must be callable, got {type(reward_fn).__name__}")
    if tokenizer.pad_token_id is None:
        raise RewardError("the tokenizer needs a pad token: TRL marks padding with it")
    index = PromptIndex.from_dataset(prompts) if hasattr(prompts, "column_names") else PromptIndex(prompts)
    return RewardFunctionModel(reward_fn, tokenizer, index, skip_special_tokens)
