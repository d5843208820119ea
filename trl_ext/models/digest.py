"""A fingerprint of a model's weights: processes that should hold the same weights (DDP's ranks, a model and
its reload) compare digests, which differ at the first differing bit, where a sum of the weights would not."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def weights_digest(tensors: Iterable[torch.Tensor]) -> str:
    """SHA-256 of the tensors' bytes, in order, with each one's dtype and shape (equal bytes of another shape
    are other weights)."""
    digest = hashlib.sha256()
    for tensor in tensors:
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
