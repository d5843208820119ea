"""LoRA adapters sent alone to vLLM (``vllm_lora_sync``): the base weights once, then each update's adapter as a
new vLLM adapter version (its own id and name), instead of the merged model every update.

What vLLM's LoRA cannot serve goes the merged way (``policy_weights``), each case named in one line by
``adapter_refusal``: with ``vllm_lora_sync="auto"`` it is routed there with a warning, with ``"adapter"`` it is an
error. The adapter is PEFT's own state dict of the active adapter (``get_peft_model_state_dict``) and its
``LoraConfig``, saved as ``save_pretrained`` saves them (``adapter_model.safetensors``, ``adapter_config.json``), in
the engine's dtype, one folder a version.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch

from trl_ext.errors import InputError
from trl_ext.ppo.rollout.policy_weights import WRAPPER_SEGMENTS

# The max_lora_rank values vLLM accepts (vllm.config.lora.MaxLoRARanks, vllm 0.32).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_FILE = "adapter_model.safetensors"


def active_lora_config(model):
    """``(adapter name, LoraConfig)`` of a PEFT model's active adapter, or None for a model without one."""
    configs = getattr(model, "peft_config", None)
    if not configs or not hasattr(model, "get_base_model"):
        return None
    name = model.active_adapter
    name = name[0] if isinstance(name, list) else name
    return name, configs[name]


def adapter_refusal(model, max_lora_rank: int | None = None) -> str | None:
    """Why this policy's adapter cannot be sent alone, in one line, or None when it can. ``max_lora_rank``: the
    engine's limit (a server's ``--max-lora-rank``); None: the largest rank vLLM takes."""
    found = active_lora_config(model)
    if found is None:
        return "the policy has no PEFT adapter"
    name, cfg = found
    kind = getattr(cfg.peft_type, "value", cfg.peft_type)
    limit = max_lora_rank or VLLM_LORA_RANKS[-1]
    if kind != "LORA":
        return f"adapter {name!r} is {kind}, not LoRA"
    if isinstance(model.active_adapter, list) and len(model.active_adapter) > 1:
        return f"{len(model.active_adapter)} active adapters; vLLM applies one a request"
    if getattr(cfg, "use_dora", False):
        return "DoRA (use_dora=True): vLLM's LoRA has no magnitude vector"
    if cfg.modules_to_save:
        saved = sorted(cfg.modules_to_save)
        return f"modules_to_save {saved}: trained copies of whole modules, which vLLM does not load"
    if getattr(cfg, "rank_pattern", None) or getattr(cfg, "alpha_pattern", None):
        return "rank_pattern/alpha_pattern: ranks or scales per layer"
    if getattr(cfg, "lora_bias", False) or cfg.bias != "none":
        return f"trained biases (bias={cfg.bias!r}, lora_bias={getattr(cfg, 'lora_bias', False)})"
    if cfg.r > limit:
        return f"rank {cfg.r} above the engine's max_lora_rank {limit}"
    embedded = [n for n, m in model.named_modules() if hasattr(m, "lora_embedding_A") and name in m.lora_embedding_A]
    if embedded:
        return f"LoRA on an embedding ({embedded[0]}), which vLLM's LoRA does not serve"
    return None


def resolve_lora_sync(setting: str, model, refusal: str | None) -> str:
    """``"adapter"`` or ``"merged"``: ``setting`` (auto / adapter / merged) for this policy, given why its adapter
    cannot be sent (``refusal``; None: it can). A refused ``"adapter"`` is an ``InputError``; ``"auto"`` warns."""
    if setting == "merged" or active_lora_config(model) is None:
        return "merged"  # a model without adapters has nothing to send alone
    if refusal is None:
        return "adapter"
    if setting == "adapter":
        raise InputError(f"vllm_lora_sync='adapter': this adapter cannot be sent alone: {refusal}")
    warnings.warn(f"vllm_lora_sync='auto': the merged model is sent each update: {refusal}", stacklevel=3)
    return "merged"


def engine_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    return next(r for r in VLLM_LORA_RANKS if r >= rank)


class AdapterVersions:
    """Each sync's adapter in a folder of its own (``v{version}``) under one folder (``root``, default temporary);
    the folder two versions back is deleted once the next is written (the engine has loaded the last one)."""

    def __init__(self, root: str | None = None):
        self._tmp = None if root else tempfile.TemporaryDirectory(prefix="trl-ext-vllm-lora-")
        self.root = Path(root or self._tmp.name)
        self.version, self.last_bytes = 0, 0

    def save(self, model, dtype: torch.dtype | None = None) -> Path:
        """The active adapter as ``save_pretrained`` writes it, tensors in ``dtype``; returns its folder."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        name, cfg = active_lora_config(model)
        self.version += 1
        folder = self.root / f"v{self.version}"
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {}
        with torch.no_grad():
            for key, tensor in get_peft_model_state_dict(model, adapter_name=name).items():
                for segment in WRAPPER_SEGMENTS:
                    key = key.replace(segment, "")
                if hasattr(tensor, "full_tensor"):  # an FSDP2 shard: the whole tensor
                    tensor = tensor.full_tensor()
                if dtype is not None and tensor.is_floating_point():
                    tensor = tensor.to(dtype)
                tensors[key] = tensor.detach().contiguous().cpu()
        save_file(tensors, str(folder / ADAPTER_FILE), metadata={"format": "pt"})
        cfg.save_pretrained(str(folder))
        self.last_bytes = sum(f.stat().st_size for f in folder.iterdir())
        old = self.root / f"v{self.version - 2}"
        if old.is_dir():
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
        return folder
