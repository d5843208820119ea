"""Whole parameters for a rollout on a sharded model.

A rollout calls the policy, a *child* of the trained root module, once per sampled token. Under
FSDP2 a child called directly keeps the root's parameters sharded (the root's unshard hook never
runs), and under DeepSpeed ZeRO-3 every layer would be gathered again for every token. So around a
rollout: FSDP2 modules are unsharded once and kept so across forwards, then resharded; ZeRO-3
parameters are gathered once with TRL's hook removal (as ``trl.models.utils.unwrap_model_for_generation``
does, whose gradient-checkpointing switch needs a ``PreTrainedModel`` root). DDP, ZeRO-1/2 and a single
process need nothing.
"""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn


def fsdp2_modules(model: nn.Module) -> list[nn.Module]:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_zero3(model: nn.Module) -> bool:
    """ZeRO-3 marks every partitioned parameter with a ``ds_id``."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


@contextmanager
def gathered_for_rollout(model: nn.Module):
    """Inside the block every parameter of ``model`` (the prepared root) is whole on every rank."""
    sharded = fsdp2_modules(model)
    if sharded:
        # The root must set up FSDP's shared state first: a child called before any root forward
        # would otherwise claim to be a root itself (private API; PyTorch's own tests use it).
        sharded[0]._get_fsdp_state()._lazy_init()
        for module in sharded:
            module.set_reshard_after_forward(False)
            module.unshard()
        try:
            yield
        finally:
            for module in sharded:
                module.reshard()
                module.set_reshard_after_forward(True)
        return
    if is_zero3(model):
        import deepspeed
        from trl.models.utils import add_hooks, remove_hooks

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            remove_hooks(model)
            try:
                yield
            finally:
                add_hooks(model)
        return
    yield
