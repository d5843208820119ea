"""Dtype names as options spell them, and the ``torch.dtype`` each names: what the trainer, the model loader and
the reward models share (the trainer's dtype policy itself: ``trl_ext.ppo.precision``)."""

from __future__ import annotations

from trl_ext.errors import InputError

DTYPES = ("auto", "bfloat16", "float16", "float32")


def torch_dtype(name: str):
    """``'auto'`` (the checkpoint's, as transformers' ``dtype='auto'``) or the ``torch.dtype`` named."""
    if name not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}; got {name!r}")
    import torch

    return name if name == "auto" else getattr(torch, name)
