"""A copy of the policy to decode with: its weights in the dtype the forward runs in, LoRA adapters merged in,
refreshed only before a rollout whose policy moved.

Decoding with the policy itself costs, on every token: under autocast, a cast of each float32 master weight to
bf16 (a compiled decode step replays the casts, the eager cast cache does not reach a CUDA graph), and under LoRA
each adapter's two small matmuls beside every weight's. The copy pays for both once per optimizer step, with the
memory of one more set of weights in the compute dtype. The sampler 'static-copy' decodes with it.
"""

from __future__ import annotations

import torch

from trl_ext.errors import InputError
from trl_ext.ppo.rollout.policy_weights import policy_weights, unwrap_peft


def forward_dtype(policy, device: torch.device) -> torch.dtype:
    """The dtype the policy's forward runs in here: autocast's where it is on (the trainer samples inside its
    autocast), else its input embeddings' (the frozen base's under LoRA, the float32 masters when fully trained)."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return unwrap_peft(policy).get_input_embeddings().weight.dtype


class DecodeCopy:
    """``of(policy, dtype)``: the copy, built at the first call (and again for another policy, dtype or device),
    synced from ``policy`` when ``stale`` (set it after every change of the policy's weights). Its parameters
    are updated in place, so a CUDA graph captured over them stays valid."""

    def __init__(self):
        self.stale = True
        self._model = None
        self._key: tuple | None = None

    def of(self, policy, dtype: torch.dtype):
        base = unwrap_peft(policy)
        device = base.get_input_embeddings().weight.device
        key = (id(base), dtype, device)
        if key != self._key:
            self._model, self._key, self.stale = None, None, True  # the old copy goes before the new one exists
            self._model, self._key = self._build(base, dtype, device), key
        if self.stale:
            self._sync(policy)
            self.stale = False
        return self._model

    @staticmethod
    def _build(base, dtype: torch.dtype, device: torch.device):
        """The policy's architecture without adapters, value head or critic, on ``device`` in ``dtype``; its
        initial weights are overwritten by the first sync, its buffers (rotary frequencies) made as the policy's."""
        with torch.device(device):
            copy = type(base)._from_config(base.config, dtype=dtype)
        return copy.eval().requires_grad_(False)

    @torch.no_grad()
    def _sync(self, policy) -> None:
        targets = self._model.state_dict()  # each shares its parameter's storage: copy_ writes the parameter
        written, storages = set(), {}  # storage -> the first name written into it (tied weights share one)
        device = self._key[2]
        with torch.autocast(device.type, enabled=False):  # LoRA deltas merged at full precision, then rounded
            for name, tensor in policy_weights(policy, self._key[1]):
                if name not in targets:
                    raise InputError(f"the decode copy of {type(self._model).__name__} has no weight {name!r}")
                target, storage = targets[name], targets[name].untyped_storage().data_ptr()
                if storage in storages and not torch.equal(target, tensor.to(target.device)):
                    raise InputError(
                        f"the policy ties {storages[storage]} and {name} but they differ (an adapter on one of "
                        "them): a decode copy holds one; use sampler 'static'"
                    )
                target.copy_(tensor)
                written.add(name)
                storages.setdefault(storage, name)
        unwritten = sorted(set(targets) - written)
        if unwritten:
            raise InputError(f"the policy gave the decode copy no value for {', '.join(unwritten[:3])}")
