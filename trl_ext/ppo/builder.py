"""What the scratch trainer trains: the policy and its tokenizer, the frozen reference, the actor-critic
(value head, a separate critic, or a critic adapter) with float32 master weights. (The optimizer and the
learning-rate schedule: ``trl_ext.ppo.optimizers``.)
"""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from trl_ext.errors import InputError
from trl_ext.models.activation_checkpointing import enable_activation_checkpointing
from trl_ext.ppo import precision
from trl_ext.ppo.advantages import needs_values
from trl_ext.ppo.model import ActorCritic, load_critic_adapter, load_value_head


def disable_dropout(module: nn.Module) -> None:
    for sub in module.modules():
        if isinstance(sub, nn.Dropout):
            sub.p = 0.0


def load_causal_lm(model, processing_class, dtype: str = "auto"):
    """``model`` as a module (loaded when it is a path, in ``dtype``, through the commands' one loader) and its
    tokenizer, with pad = eos when it has none (as GRPO)."""
    from trl_ext.models.loading import load_policy, pad_with_eos

    if isinstance(model, (str, Path)):
        return load_policy(model, dtype, tokenizer=processing_class, error=InputError)
    path, model = getattr(model.config, "_name_or_path", None), precision.cast_model(model, dtype)
    if processing_class is None:
        if not path:
            raise InputError("pass processing_class: the model was not loaded from a path, so its tokenizer is unknown")
        from transformers import AutoTokenizer

        from trl_ext.models.directory import load_tokenizer

        processing_class = (
            load_tokenizer(path, "policy") if Path(path).is_dir() else AutoTokenizer.from_pretrained(path)
        )
    return model, pad_with_eos(processing_class, "policy", f"of {path!r}" if path else "given", InputError)


def critic_source(path: str | None):
    """The scalar reward model whose backbone and score head start the critic (``critic_init``), or None."""
    if path is None:
        return None
    from trl_ext.models.loading import load_sequence_classifier

    return load_sequence_classifier(
        path, "critic_init", labels=1, why="the critic starts from a scalar reward model (num_labels=1)"
    )[0]


def reference_model(ref_model, policy) -> nn.Module:
    """The given reference (a module, or a folder loaded in the policy's dtype), refused when its output
    vocabulary is not the policy's: the KL would compare other tokens' log-probs, or fail on the shapes."""
    if isinstance(ref_model, (str, Path)):
        from trl_ext.models.loading import load_policy

        ref_model = load_policy(ref_model, role="ref_model", error=InputError)[0].to(precision.model_dtype(policy))
    if not isinstance(ref_model, nn.Module):
        raise InputError(f"ref_model must be a causal LM (a module or its folder), got {type(ref_model).__name__}")
    rows = [_output_rows(m) for m in (ref_model, policy)]
    if None not in rows and rows[0] != rows[1]:
        raise InputError(
            f"ref_model's output vocabulary has {rows[0]} rows and the policy's {rows[1]}: the reference must "
            "score the policy's tokens (the same tokenizer and vocabulary size)"
        )
    return ref_model


def _output_rows(model: nn.Module) -> int | None:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return None if head is None else head.weight.shape[0]


def needs_reference(config) -> bool:
    """Whether any KL to the reference enters the run (``kl_coef`` in the reward, ``beta`` in the loss)."""
    return config.kl_coef > 0 or config.beta > 0


def build_models(
    policy,
    config,
    peft_config=None,
    ref_model=None,
    saved_at: str | Path | None = None,
    uniform_dtype: bool = False,
    device=None,
) -> tuple[ActorCritic, nn.Module | None]:
    """The actor-critic to train and the frozen reference (None when there is none to run: no KL term, or a PEFT
    policy, whose reference is itself with its adapters off, so no second copy).

    ``saved_at``: the folder the policy came from, whose value head a continued PPO run loads.
    ``uniform_dtype``: every trained weight float32 (FSDP/DeepSpeed flatten parameters into one dtype).
    ``device``: where the reference runs (the actor-critic is placed by the launch's ``prepare``)."""
    if peft_config is not None:
        from trl_ext.models.loading import peft_model  # a target-module mismatch: one line naming the modules

        policy = peft_model(policy, peft_config)
    reference = None
    if ref_model is not None:
        reference = reference_model(ref_model, policy)
    elif needs_reference(config) and not hasattr(policy, "disable_adapter"):
        reference = copy.deepcopy(policy)  # before master weights: it keeps the checkpoint's dtype
    if reference is not None:
        reference.eval().requires_grad_(False).to(device or "cpu")
        disable_dropout(reference)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(policy)
    model = ActorCritic(
        policy,
        separate_critic=config.separate_critic,
        value_head_init=config.value_head_init,
        critic=needs_values(config),
        critic_source=critic_source(config.critic_init),
        critic_adapter=config.critic_adapter,
    )
    if config.gradient_checkpointing and model.critic_adapter:
        recompute_under_own_adapter(model)
    if saved_at is not None and model.value_head is not None:
        load_value_head(model.value_head, saved_at)  # continuing from a saved PPO policy
    if saved_at is not None and model.critic_adapter:
        load_critic_adapter(model.policy, saved_at)
    precision.float32_master_weights(model, uniform=uniform_dtype)
    disable_dropout(model)
    return model, reference


def recompute_under_own_adapter(model: ActorCritic) -> None:
    """Activation checkpointing whose backward-pass recomputation of a layer runs under the adapter its forward ran
    with (torch's ``context_fn``): the critic's pass is recomputed while the policy's adapter is the active one."""
    options = {"use_reentrant": False, "context_fn": model.checkpoint_context}
    if hasattr(model.policy, "activation_checkpointing_enable"):  # transformers >= 5.24's name
        model.policy.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
