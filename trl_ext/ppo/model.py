"""Actor-critic for language models: a causal LM plus a linear value head.

Shared (default): the value head reads the policy's own last hidden
state, so one forward pass gives logits and values. Separate: the value head sits on
a copy of the policy's backbone, a critic that shares nothing with the actor. Critic adapter (a LoRA
policy): the value head reads the frozen base under a second LoRA adapter of its own ('critic'), a second pass
over the same inputs; a separate critic for the price of an adapter.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn

from trl_ext.errors import InputError
from trl_ext.ppo.lm_head import TokenLogprobs, token_logprobs
from trl_ext.ppo.lm_head import backbone as base_backbone

VALUE_HEAD_FILE = "value_head.safetensors"
CRITIC_ADAPTER = "critic"  # the critic's LoRA adapter, beside the policy's (peft's "default")
CRITIC_ADAPTER_FILE = "critic_adapter.safetensors"


def hidden_size(model) -> int:
    return model.get_input_embeddings().embedding_dim


VALUE_HEAD_INITS = ("linear", "zero")


class ActorCritic(nn.Module):
    """``value_head_init``: 'linear' is ``nn.Linear``'s own random init, as TRL's
    ``AutoModelForCausalLMWithValueHead``; 'zero' starts at V = 0 (docs/decisions.md, "The KL gap", measures both)."""

    def __init__(
        self,
        policy,
        separate_critic: bool = False,
        value_head_init: str = "linear",
        critic: bool = True,
        critic_source=None,
        critic_adapter: bool = False,
    ):
        super().__init__()
        if value_head_init not in VALUE_HEAD_INITS:
            raise InputError(f"value_head_init must be one of {', '.join(VALUE_HEAD_INITS)}; got {value_head_init!r}")
        if critic_adapter and separate_critic:
            raise InputError(
                "give separate_critic or critic_adapter, not both: both give the critic a backbone of its "
                "own, a copy or a LoRA adapter"
            )
        self.policy = policy
        # The policy's and the critic's adapters (both trained, each by its own loss); empty without critic_adapter.
        self._adapters = add_critic_adapter(policy) if critic_adapter and critic else []
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
            raise InputError(
                "critic_init needs separate_critic=True and an estimator with a critic (gae): the "
                "reward model's backbone becomes the critic's"
            )
        score = getattr(reward_model, "score", None)
        source = base_backbone(reward_model)
        if (
            type(source) is not type(self.critic_backbone)
            or not isinstance(score, nn.Linear)
            or score.weight.shape != self.value_head.weight.shape
        ):
            raise InputError(
                f"critic_init: a {type(reward_model).__name__} cannot seed the critic of a "
                f"{type(self.policy).__name__}: it needs the policy's architecture and hidden size and one "
                "linear 'score' output (a reward model trained from the policy, num_labels=1)"
            )
        self.critic_backbone.load_state_dict(source.state_dict())
        with torch.no_grad():
            self.value_head.weight.copy_(score.weight)
            self.value_head.bias.copy_(score.bias if score.bias is not None else torch.zeros(1))

    @property
    def separate_critic(self) -> bool:
        return self.critic_backbone is not None

    @property
    def critic_adapter(self) -> bool:
        return bool(self._adapters)

    def _use_adapter(self, name: str) -> None:
        self.policy.set_adapter(name)
        for param in self._adapters:  # peft's set_adapter freezes the inactive adapter; both train
            param.requires_grad_(True)

    @contextmanager
    def critic_adapter_active(self):
        """The critic's LoRA adapter active instead of the policy's (on the same base), the policy's again after."""
        policy_adapter = self.policy.active_adapter
        self._use_adapter(CRITIC_ADAPTER)
        try:
            yield
        finally:
            self._use_adapter(policy_adapter)

    def checkpoint_context(self):
        """Activation checkpointing's ``context_fn``, called at each checkpointed layer's forward: its recomputation
        in the backward pass runs under the adapter active now, whichever is active then."""
        adapter = self.policy.active_adapter

        @contextmanager
        def recompute():
            current = self.policy.active_adapter
            if current != adapter:
                self._use_adapter(adapter)
            try:
                yield
            finally:
                if current != adapter:
                    self._use_adapter(current)

        return nullcontext(), recompute()

    def critic_parameters(self) -> list[nn.Parameter]:
        """The value function's own parameters: the head, and the critic's backbone or adapter where it has one (a
        critic on the policy's backbone shares that backbone, which stays the policy's)."""
        if self.value_head is None:
            return []
        own = list(self.value_head.parameters())
        if self.critic_backbone is not None:
            own += list(self.critic_backbone.parameters())
        if self.critic_adapter:
            own += [p for name, p in self.policy.named_parameters() if f".{CRITIC_ADAPTER}." in name]
        return own

    @property
    def critic_has_backbone(self) -> bool:
        """The critic reads a backbone of its own (a copy or its adapter): its pass can run apart from the policy's."""
        return self.value_head is not None and (self.separate_critic or self.critic_adapter)

    def forward(
        self,
        input_ids,
        attention_mask,
        position_ids,
        logits_to_keep: int | torch.Tensor = 0,
        critic_only: bool = False,
        outputs: str = "both",
        logprobs_of: TokenLogprobs | None = None,
    ):
        """Return ``(logits (B, K, V), values (B, L) or None without a critic)``: logits of the last
        ``logits_to_keep`` positions or of those indices (0: all, ``K = L``; HF's option), values of every position.
        ``logprobs_of`` (``logits_to_keep`` then indices): ``(log-probs, entropy or None)`` of its tokens in place of
        the logits (``lm_head.token_logprobs``: through the model's head, or chunked, no ``(B, K, V)`` logits made).
        ``critic_only`` (critic warm-up): the policy runs without gradients, so its graph is never built and the
        values' gradients reach the value function alone, not a shared backbone. ``outputs``: ``"both"``,
        ``"logits"`` (no critic pass, values None) or ``"values"`` (the critic's own pass alone, logits None: a
        critic with a backbone of its own)."""
        if outputs not in ("both", "logits", "values") or (outputs == "values" and not self.critic_has_backbone):
            raise InputError(
                f"outputs must be 'both', 'logits' or 'values' ('values': a critic with a backbone of its own); "
                f"got {outputs!r}"
            )
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        if outputs == "values":
            return None, self._values(self._critic_hidden(inputs))
        with_values = outputs == "both" and self.value_head is not None
        shared = with_values and not self.critic_has_backbone
        with torch.set_grad_enabled(torch.is_grad_enabled() and not critic_only):
            if logprobs_of is None:
                out = self.policy(**inputs, output_hidden_states=shared, logits_to_keep=logits_to_keep)
                first, hidden = out.logits, (out.hidden_states[-1] if shared else None)
            else:
                logprobs, entropy, hidden = token_logprobs(self.policy, inputs, logits_to_keep, logprobs_of, shared)
                first = (logprobs, entropy)
        if not with_values:
            return first, None
        return first, self._values(hidden if shared else self._critic_hidden(inputs))

    def _critic_hidden(self, inputs: dict) -> torch.Tensor:
        """The last hidden states of the critic's own backbone: the copy, or the base under the critic's adapter."""
        if self.separate_critic:
            return self.critic_backbone(**inputs).last_hidden_state
        with self.critic_adapter_active():  # a second pass over the same inputs
            return base_backbone(self.policy)(**inputs).last_hidden_state

    def _values(self, hidden: torch.Tensor) -> torch.Tensor:
        # A bf16 backbone hands bf16 states to the float32 head (precision.py); autocast recasts if on.
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)

    def save_value_head(self, path: str | Path) -> None:
        """The value function beside a saved policy: the head, and the critic's adapter where it has one."""
        if self.value_head is not None:
            save_value_head(self.value_head, path)
        if self.critic_adapter:
            save_critic_adapter(self.policy, path)

    def save_policy(self, path: str | Path) -> None:
        """The policy with ``save_pretrained``: with a critic adapter, the policy's adapter alone (peft would write
        every adapter, the critic's in a subfolder; the critic's goes beside, with the value head)."""
        adapters = {"selected_adapters": [self.policy.active_adapter]} if self.critic_adapter else {}
        self.policy.save_pretrained(path, safe_serialization=True, **adapters)


def add_critic_adapter(policy) -> list[nn.Parameter]:
    """A second LoRA adapter, ``CRITIC_ADAPTER``, on a PEFT policy's frozen base, of the policy adapter's own
    config (LoRA's B starts at zero: the critic starts on the base model). Returns both adapters' parameters."""
    from peft import PeftModel

    if not isinstance(policy, PeftModel):
        raise InputError(
            "critic_adapter needs a LoRA policy: pass peft_config (the critic's adapter sits beside the "
            "policy's on the same frozen base)"
        )
    config = copy.deepcopy(policy.peft_config[policy.active_adapter])
    config.inference_mode = False
    policy.add_adapter(CRITIC_ADAPTER, config)
    for name, param in policy.named_parameters():  # peft adds it frozen, being inactive
        if f".{CRITIC_ADAPTER}." in name:
            param.requires_grad_(True)
    return [p for p in policy.parameters() if p.requires_grad]


def save_critic_adapter(policy, path: str | Path) -> Path:
    """The critic's adapter as ``critic_adapter.safetensors`` (peft's state-dict keys) beside a saved policy."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    file = Path(path) / CRITIC_ADAPTER_FILE
    state = get_peft_model_state_dict(policy, adapter_name=CRITIC_ADAPTER)
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(file))
    return file


def load_critic_adapter(policy, path: str | Path) -> bool:
    """Load ``critic_adapter.safetensors`` from ``path`` into the policy's critic adapter if it is there."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    file = Path(path) / CRITIC_ADAPTER_FILE
    if not file.exists():
        return False
    state = load_file(str(file))
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(policy, adapter_name=CRITIC_ADAPTER).items()}
    found = {k: tuple(v.shape) for k, v in state.items()}
    if found != expected:
        raise InputError(
            f"{file} holds a critic adapter of {len(found)} tensors that does not fit this policy's "
            f"({len(expected)} tensors; LoRA rank and target modules must match)"
        )
    set_peft_model_state_dict(policy, state, adapter_name=CRITIC_ADAPTER)
    return True


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
