"""The dtype policy of the scratch trainer: which tensors live in which floating-point type.

* The checkpoint's dtype (or ``--dtype``) is the *compute* dtype of the frozen parts: the reference
  policy, the reward model and a LoRA base keep it (they are never stepped, so bf16 costs nothing).
* Trainable parameters (value head, separate critic, LoRA adapters, fully fine-tuned weights) are
  float32 *master weights*, as accelerate's and DeepSpeed's mixed precision keep them: Adam's small
  updates vanish in bf16. The forward runs in the compute dtype under autocast when the launch has
  mixed precision on; otherwise each layer runs in its weights' dtype and the value head casts the
  hidden states it reads to its own.
* Under FSDP or DeepSpeed the whole wrapped module is float32: flat parameters need one dtype, and the
  sharding engine's own mixed precision casts for the forward.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager

import torch
from torch import nn

from trl_ext.errors import InputError
from trl_ext.models.dtypes import torch_dtype


def cast_model(model: nn.Module, name: str) -> nn.Module:
    """``model`` in the dtype ``name`` asks for (unchanged for 'auto')."""
    dtype = torch_dtype(name)
    return model if dtype == "auto" else model.to(dtype)


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of a model's floating-point parameters (the first one's; float32 when it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def float32_master_weights(model: nn.Module, uniform: bool = False) -> nn.Module:
    """Trainable parameters to float32 in place; frozen ones keep their dtype unless ``uniform``
    (FSDP/DeepSpeed: every floating-point parameter and buffer of the wrapped module to float32)."""
    if uniform:
        return model.float()
    for param in model.parameters():
        if param.requires_grad and param.is_floating_point() and param.dtype != torch.float32:
            param.data = param.data.float()
    return model


# torch's words for a kernel missing in a dtype: "... not implemented for 'Half'", "Low precision dtypes
# not supported. Got BFloat16", ...
MISSING_KERNEL = re.compile(
    r"(not implemented|not supported|unsupported).*(Half|BFloat16)|"
    r"(Half|BFloat16).*(not implemented|not supported|unsupported)",
    re.IGNORECASE,
)


def check_device_supports(dtype: torch.dtype, device: torch.device) -> None:
    """A ValueError naming ``dtype`` and ``--dtype`` when ``device`` cannot run it at all."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise InputError(
            f"this GPU ({torch.cuda.get_device_name(device)}) cannot run bfloat16: pass --dtype float16 "
            "or --dtype float32"
        )


def unsupported_dtype_error(error: BaseException, device: torch.device) -> InputError | None:
    """The one-line error for an op that ``device`` lacks in bf16 or fp16 (None when ``error`` is something else)."""
    text = str(error)
    match = MISSING_KERNEL.search(text)
    if match is None:
        return None
    name = "float16" if "half" in match.group(0).lower() else "bfloat16"
    return InputError(
        f"an operation of this model has no {name} kernel on {device.type} "
        f"({text.splitlines()[0]}): pass --dtype float32"
    )


@contextmanager
def explained_dtype_errors(device: torch.device):
    """Inside the block, an op missing for bf16/fp16 on ``device`` becomes ``unsupported_dtype_error``'s line."""
    try:
        yield
    except RuntimeError as error:
        explained = unsupported_dtype_error(error, device)
        if explained is None:
            raise
        raise explained from None


def launch_training_arguments() -> dict:
    """``bf16``/``fp16``/``use_cpu`` for a transformers ``TrainingArguments`` (TRL's trainers) from the launch:
    ``accelerate launch`` exports its ``mixed_precision`` as ``ACCELERATE_MIXED_PRECISION``; the CPU only
    without CUDA."""
    mixed = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").lower()
    if mixed not in ("no", "bf16", "fp16"):
        raise InputError(f"ACCELERATE_MIXED_PRECISION={mixed!r}: TRL's trainers here take no, bf16 or fp16")
    return {"bf16": mixed == "bf16", "fp16": mixed == "fp16", "use_cpu": not torch.cuda.is_available()}
