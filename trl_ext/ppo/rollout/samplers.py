"""Rollout engines behind one interface: prompts in as token ids, completions out.

Every engine answers ``sample(model, query_ids, query_mask, options, generator) -> Completions``:
``(B, R)`` response ids with pad after each row's first eos and, where the engine knows them, the
log-probs it sampled those tokens with. The trainer keeps its own forward pass as the old log-probs;
an engine's log-probs only measure (and may correct for) the gap between the two.

An engine that holds its own copy of the weights (vLLM) is told ``policy_changed()`` after every
optimizer step and syncs before its next rollout; the others call the policy they are handed.
Register an engine with ``@SAMPLERS.register(name)``; the config's ``sampler`` picks it by name.
"""

from __future__ import annotations

import torch

from trl_ext.ppo.rollout.decode_copy import DecodeCopy, forward_dtype
from trl_ext.ppo.rollout.interface import Completions, Sampler, SamplingOptions, trimmed
from trl_ext.ppo.rollout.loop import generate_responses, sample_responses
from trl_ext.ppo.rollout.static_sampler import StaticDecoder
from trl_ext.settings.registry import Registry

__all__ = ["SAMPLERS", "Completions", "Sampler", "SamplingOptions", "build_sampler", "resolve_sampler", "trimmed"]

SAMPLERS = Registry("sampler", takes_config=False)


@SAMPLERS.register("loop")
class LoopSampler(Sampler):
    """The KV-cache loop (``rollout.loop.sample_responses``): fastest for small models on CPU."""

    def sample(self, model, query_ids, query_mask, options, generator=None):
        return Completions(sample_responses(model, query_ids, query_mask, options, generator))


@SAMPLERS.register("generate")
class GenerateSampler(Sampler):
    """``model.generate`` (``rollout.loop.generate_responses``): has ``repetition_penalty``; draws from torch's global
    RNG."""

    def sample(self, model, query_ids, query_mask, options, generator=None):
        return Completions(generate_responses(model, query_ids, query_mask, options))


@SAMPLERS.register("static")
class StaticCacheSampler(Sampler):
    """Static KV cache, decode step compiled to a CUDA graph on GPUs (``static_sampler.StaticDecoder``)."""

    def __init__(self):
        self.engine = StaticDecoder()  # holds its caches and compiled step across rollouts

    def sample(self, model, query_ids, query_mask, options, generator=None):
        return Completions(self.engine(model, query_ids, query_mask, options, generator))


@SAMPLERS.register("static-copy")
class StaticCopySampler(StaticCacheSampler):
    """The static sampler over a copy of the policy in the forward's dtype, LoRA adapters merged
    (``decode_copy.DecodeCopy``), synced before a rollout whose policy moved."""

    def __init__(self):
        super().__init__()
        self.copy = DecodeCopy()

    def policy_changed(self) -> None:
        self.copy.stale = True

    def sample(self, model, query_ids, query_mask, options, generator=None):
        return super().sample(
            self.copy.of(model, forward_dtype(model, query_ids.device)), query_ids, query_mask, options, generator
        )


# Where vLLM was measured to win on CPU (docs/vllm.md): SmolLM2-135M rollouts 4.9-6.2x faster than the loop; on the
# doubling task's 0.2M-parameter policy it lost (an engine start and a sync a rollout for milliseconds of compute).
VLLM_CPU_MIN_PARAMETERS = 100_000_000


def resolve_sampler(config, device: torch.device, policy=None) -> str:
    """The engine ``config.sampler`` names; 'auto' picks the one measured fastest for this device and policy: vLLM
    on CPU where it is installed, the policy has 100M parameters or more and heads its CPU attention runs, and
    sampling filters nothing (measured without top-k/top-p; top-p over the whole vocabulary is vLLM CPU's slow path);
    on a GPU the static sampler (its decode step a CUDA graph: the fastest there, docs/results.md "On one GPU"; vLLM
    not measured on one); otherwise the loop."""
    if config.sampler != "auto":
        return config.sampler
    if config.vllm_mode == "server":  # a server was asked for: it is the engine
        return "vllm"
    if device.type == "cuda":
        return "static"
    unfiltered = config.top_k == 0 and config.top_p == 1.0
    return "vllm" if policy is not None and unfiltered and _vllm_wins_on_cpu(policy) else "loop"


def _vllm_wins_on_cpu(policy) -> bool:
    from trl_ext.errors import InputError
    from trl_ext.ppo.rollout.vllm_sampler import check_cpu_head_size, vllm_installed

    if not vllm_installed() or sum(p.numel() for p in policy.parameters()) < VLLM_CPU_MIN_PARAMETERS:
        return False
    try:
        check_cpu_head_size(policy.config)
    except InputError:
        return False
    return True


@SAMPLERS.register("vllm", takes_config=True)
def vllm_sampler(config) -> Sampler:
    """vLLM colocated in this process (``trl_ext.ppo.rollout.vllm_sampler``) or a vLLM server
    (``trl_ext.ppo.rollout.vllm_server``, ``vllm_mode='server'``), imported only when asked for."""
    if config is not None and config.vllm_mode == "server":
        from trl_ext.ppo.rollout.vllm_server import VLLMServerSampler

        return VLLMServerSampler(config)
    from trl_ext.ppo.rollout.vllm_sampler import VLLMSampler

    return VLLMSampler(config)


def build_sampler(name: str, config=None) -> Sampler:
    """The engine registered as ``name``; those that need the trainer's settings (vLLM's) get ``config``."""
    entry = SAMPLERS[name]
    return entry.fn(config) if entry.takes_config else entry.fn()
