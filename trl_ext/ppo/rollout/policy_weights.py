"""The policy's weights as a checkpoint of it names them, for an inference engine: LoRA adapters merged in without
touching the trained module, wrapper segments dropped, in the engine's dtype."""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from trl_ext.errors import InputError

# Parameters PEFT adds beside a wrapped layer's own; never sent (what they add is merged into the weight).
LORA_PARAMETER = re.compile(r"\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)\.")
# Wrappers that put a segment into parameter names: gradient checkpointing's and torch.compile's.
WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def unwrap_peft(model):
    """The transformers model under a PEFT wrapper (LoRA layers injected), or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model


def _peft_modules(base) -> tuple[dict, dict]:
    """``{name: LoraLayer}`` and ``{name: ModulesToSaveWrapper}`` in ``base`` (empty without PEFT)."""
    try:
        from peft.tuners.lora import LoraLayer
        from peft.utils import ModulesToSaveWrapper
    except ImportError:
        return {}, {}
    lora, saved = {}, {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            lora[name] = module
        elif isinstance(module, ModulesToSaveWrapper):
            saved[name] = module
    return lora, saved


def _merged_weight(module, weight: torch.Tensor, name: str) -> torch.Tensor:
    """``weight`` of a LoRA layer plus its active adapters' deltas (float32), unless they are off or merged."""
    if module.merged or module.disable_adapters:
        return weight  # merged: the weight already holds them; disabled: the base alone is the policy
    adapters = [a for a in module.active_adapters if a in module.lora_A or a in module.lora_embedding_A]
    if not adapters:
        return weight
    if any(module.use_dora.get(a, False) for a in adapters):
        raise InputError(
            f"samplers 'vllm' and 'static-copy' merge plain LoRA adapters only; {name} uses DoRA (use_dora=True)"
        )
    merged = weight.float()
    for adapter in adapters:
        merged = merged + module.get_delta_weight(adapter).float()  # scaling, fan_in_fan_out (GPT-2) included
    return merged


def policy_weights(model, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the policy's ``state_dict`` under the name a checkpoint of it has (tied embeddings
    included: ``lm_head.weight`` beside the input embedding), LoRA adapters merged into the weights they adapt,
    floating-point tensors in ``dtype`` (the engine's; None: as they are). Nothing of ``model`` changes (deltas
    are added to copies); merged weights are made one at a time."""
    base = unwrap_peft(model)
    lora, saved = _peft_modules(base)
    chosen = {}  # a modules_to_save wrapper's prefix -> the prefix of the copy in use
    for name, wrapper in saved.items():
        active = wrapper.active_adapter
        active = active[0] if isinstance(active, list) else active
        use_copy = not wrapper.disable_adapters and active in wrapper.modules_to_save
        chosen[name] = f"{name}.modules_to_save.{active}." if use_copy else f"{name}.original_module."
    for key, tensor in base.state_dict().items():
        if LORA_PARAMETER.search(key):
            continue
        for segment in WRAPPER_SEGMENTS:
            key = key.replace(segment, "")
        owner = next((n for n in saved if key.startswith(n + ".")), None)
        if owner is not None:
            if not key.startswith(chosen[owner]):
                continue  # the copy not in use
            key = owner + "." + key[len(chosen[owner]) :]
        if ".base_layer." in key:
            module_name, _, parameter = key.partition(".base_layer.")
            key = f"{module_name}.{parameter}"
            if module_name in lora and parameter == "weight":
                tensor = _merged_weight(lora[module_name], tensor, module_name)
        if hasattr(tensor, "full_tensor"):  # a DTensor shard (FSDP2 outside an unshard): the whole tensor
            tensor = tensor.full_tensor()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)  # float32 masters (and merged LoRA weights) rounded once, here
        yield key.removeprefix("base_model.model."), tensor.detach()


def compute_dtype(model, config) -> torch.dtype:
    """The dtype vLLM runs in: ``config.dtype`` when set, else the checkpoint's (the model config's ``dtype``),
    else that of the first parameter that is not trained (a LoRA base), else float32. Not the trained
    parameters': the trainer keeps those as float32 masters whatever the checkpoint's dtype."""
    from trl_ext.models.dtypes import torch_dtype

    if getattr(config, "dtype", "auto") != "auto":
        return torch_dtype(config.dtype)
    base = unwrap_peft(model)
    # read as stored: the property ``torch_dtype`` warns that it is deprecated
    saved = vars(base.config).get("dtype") or vars(base.config).get("torch_dtype")
    if isinstance(saved, str):
        saved = getattr(torch, saved, None)
    if isinstance(saved, torch.dtype) and saved.is_floating_point:
        return saved
    frozen = next((p.dtype for p in base.parameters() if not p.requires_grad and p.is_floating_point()), None)
    return frozen or torch.float32
