"""The optimizer and the learning-rate schedule of the scratch trainer, with TRL's settings (AdamW, no weight decay,
eps 1e-8), so the backends differ in the loop only. ``optim`` takes transformers' names:

- ``adamw_torch_fused``: torch's AdamW with the fused kernel on a GPU (transformers' default there, so TRL's):
  foreach's step makes full-size temporaries, gigabytes for a fully fine-tuned 0.5B policy. Elsewhere foreach,
  which every CPU result was measured with.
- ``adamw_torch_8bit``: torchao's ``AdamW8bit``: both moments in 8 bits with a scale per block of 256 values, a
  quarter of float32's memory (8 bytes a weight become about 2); a tensor under 4,096 values, or not a multiple of
  256, keeps float32 moments. Its step is compiled (on CPU, a C++ compiler is needed, and the first step takes
  seconds).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from trl_ext.errors import InputError

# optim name -> the package it needs beyond torch (None: torch's own)
OPTIMIZERS: dict[str, str | None] = {"adamw_torch_fused": None, "adamw_torch_8bit": "torchao"}
DEFAULT_OPTIMIZER = "adamw_torch_fused"


def check_optimizer(optim: str) -> None:
    """Refuse an optimizer this environment cannot build, before anything is loaded or written."""
    if optim not in OPTIMIZERS:
        raise InputError(f"optim must be one of {', '.join(OPTIMIZERS)}, got {optim!r}")
    package = OPTIMIZERS[optim]
    if package is not None and importlib.util.find_spec(package) is None:
        raise InputError(f"optim={optim!r} needs the {package} package: pip install {package}")


def build_optimizer(
    model: nn.Module,
    learning_rate: float,
    device: torch.device,
    optim: str = DEFAULT_OPTIMIZER,
    critic_learning_rate: float | None = None,
) -> torch.optim.Optimizer:
    """``optim`` over ``model``'s trainable parameters (see the module's text). ``critic_learning_rate``: the
    critic's (``model.critic_parameters()``) in a parameter group of their own at that rate, as OpenRLHF and verl
    give the critic an optimizer of its own. AdamW's step is per parameter, so a group steps as a second optimizer
    would, but for ``max_grad_norm``, which clips the whole model's norm; the schedule scales both rates alike."""
    check_optimizer(optim)
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups: list[dict] = [{"params": trainable}]
    if critic_learning_rate is not None:
        critic = {id(p) for p in model.critic_parameters()}
        groups = [
            {"params": [p for p in trainable if id(p) not in critic]},
            {"params": [p for p in trainable if id(p) in critic], "lr": critic_learning_rate},
        ]
        groups = [g for g in groups if g["params"]]
    settings = dict(lr=learning_rate, eps=1e-8, weight_decay=0.0)
    if optim == "adamw_torch_8bit":
        from torchao.optim import AdamW8bit

        return AdamW8bit(groups, **settings)
    fused = device.type == "cuda"
    return torch.optim.AdamW(groups, **settings, foreach=not fused, fused=fused)


def build_lr_scheduler(optimizer, schedule: str, total_updates: int):
    """Stepped once per update, as TRL does: 'linear' falls to 0 at the end of the run; 'constant' stays."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    if schedule == "linear":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / total_updates))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def optimizer_state_bytes(optimizer) -> int:
    """The bytes ``optimizer``'s state holds (an 8-bit moment: its codes, a scale per block and its code map)."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    tensors = [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    parts = [p for t in tensors for p in ((t.codes, t.scale, t.qmap) if hasattr(t, "codes") else (t,))]
    return sum(p.numel() * p.element_size() for p in parts)


def optimizer_training_argument(optim: str) -> dict:
    """The ``optim`` of a TRL config (a ``TrainingArguments``) for ours: nothing for the default, which is
    transformers' own (so TRL's); transformers builds the same torchao optimizer for ``adamw_torch_8bit``."""
    return {} if optim == DEFAULT_OPTIMIZER else {"optim": optim}
