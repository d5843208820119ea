"""Actor-critic for language models: a causal LM plus a linear value head.

Shared (default): the value head reads the policy's own last hidden
state, so one forward pass gives logits and values. Separate: the value head sits on
a copy of the policy's backbone, a critic that shares nothing with the actor.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from trl_ext.errors import InputError

VALUE_HEAD_FILE = "value_head.safetensors"


def hidden_size(model) -> int:
    return model.get_input_embeddings().embedding_dim


def base_backbone(model):
    """The transformer under the LM head (``model.transformer`` for GPT-2, ``model.model`` for Qwen)."""
    return getattr(model, model.base_model_prefix)


VALUE_HEAD_INITS = ("linear", "zero")


class ActorCritic(nn.Module):
    """``value_head_init``: 'linear' is ``nn.Linear``'s own random init, as TRL's
    ``AutoModelForCausalLMWithValueHead``; 'zero' starts at V = 0 (docs/decisions.md, "The KL gap", measures both)."""

    def __init__(self, policy, separate_critic: bool = False, value_head_init: str = "linear", critic: bool = True,
                 critic_source=None):
        super().__init__()
        if value_head_init not in VALUE_HEAD_INITS:
            raise InputError(f"value_head_init must be one of {', '.join(VALUE_HEAD_INITS)}; got {value_head_init!r}")
        self.policy = policy
        # critic=False (critic-free estimators): no value head, no critic pass, values are None.
        self.critic_backbone = copy.deepcopy(base_backbone(policy)) if separate_critic and critic else None
        self.value_head = nn.Linear(hidden_size(policy), 1) if critic else None
        if critic and value_head_init == "zero":
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
        if critic_source is not None:
            self._init_critic_from(critic_source)

    def _init_critic_from(self, reward_model) -> None:
        """Seed 003's critic: the backbone and score head of a scalar reward model of the policy's architecture,
        so the first values are the reward model's own estimates instead of noise."""
        if self.critic_backbone is None:
            raise InputError("critic_init needs separate_critic=True and an estimator with a critic (gae): the "
                             "reward model's backbone becomes the critic's")
        score = getattr(reward_model, "score", None)
        source = base_backbone(reward_model)
        if type(source) is not type(self.critic_backbone) or not isinstance(score, nn.Linear) or \
                score.weight.shape != self.value_head.weight.shape:
            raise InputError(f"critic_init: a {type(reward_model).__name__} cannot seed the critic of a "
                             f"{type(self.policy).__name__}: it needs the policy's architecture and hidden size and one "
                             "linear 'score' output (a reward model trained from the policy, num_labels=1)")
        self.critic_backbone.load_state_dict(source.state_dict())
        with torch.no_grad():
            self.value_head.weight.copy_(score.weight)
            self.value_head.bias.copy_(score.bias if score.bias is not None else torch.zeros(1))

    @property
    def separate_critic(self) -> bool:
        return self.critic_backbone is not None

    def forward(self, input_ids, attention_mask, position_ids, logits_to_keep: int | torch.Tensor = 0,
                critic_only: bool = False):
        """Return ``(logits (B, K, V), values (B, L) or None without a critic)``: logits of the last
        ``logits_to_keep`` positions or of those indices (0: all, ``K = L``; HF's option), values of every position.
        ``critic_only`` (critic warm-up): the policy runs without gradients, so its graph is never built and the
        values' gradients reach the value function alone, not a shared backbone."""
        shared = self.value_head is not None and not self.separate_critic
        with torch.set_grad_enabled(torch.is_grad_enabled() and not critic_only):
            out = self.policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              output_hidden_states=shared, use_cache=False, logits_to_keep=logits_to_keep)
        if self.value_head is None:
            return out.logits, None
        if self.separate_critic:
            hidden = self.critic_backbone(input_ids=input_ids, attention_mask=attention_mask,
                                          position_ids=position_ids, use_cache=False).last_hidden_state
        else:
            hidden = out.hidden_states[-1]
        # A bf16 backbone hands bf16 states to the float32 head (precision.py); autocast recasts if on.
        hidden = hidden.to(self.value_head.weight.dtype)
        return out.logits, self.value_head(hidden).squeeze(-1)

    def save_value_head(self, path: str | Path) -> None:
        if self.value_head is not None:
            save_value_head(self.value_head, path)


def load_value_head(head: nn.Module, path: str | Path) -> bool:
    """Load ``value_head.safetensors`` from ``path`` into ``head`` if it is there (a run continued
    from a saved PPO policy keeps its critic); returns whether it was."""
    from safetensors.torch import load_file

    file = Path(path) / VALUE_HEAD_FILE
    if not file.exists():
        return False
    state = load_file(str(file))
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state.items()}
    if found != expected:
        raise InputError(f"{file} holds a value head of shapes {found}; this policy needs {expected}")
    head.load_state_dict(state)
    return True


def save_value_head(head: nn.Module, path: str | Path) -> Path:
    """A value head's weights as ``value_head.safetensors`` beside a saved policy."""
    from safetensors.torch import save_file

    file = Path(path) / VALUE_HEAD_FILE
    save_file({k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}, str(file))
    return file
