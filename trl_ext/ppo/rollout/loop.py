"""Sampling responses with a KV cache (the loop and ``model.generate``), and the masks of what was sampled."""

from __future__ import annotations

from importlib.metadata import version

import torch
from packaging.version import Version

from trl_ext.data.sequences import positions_from_mask, response_mask
from trl_ext.ppo.rollout.interface import SamplingOptions

# transformers 5.24 renamed the KV-cache argument and output field `past_key_values` to `cache` (the old name
# warns, and goes in 5.40): the name the installed transformers takes.
CACHE_ARG = "cache" if Version(version("transformers")).release[:2] >= (5, 24) else "past_key_values"


def last_positions(length: int, count: int, device: torch.device | None = None) -> torch.Tensor:
    """``logits_to_keep`` for the last ``count`` of ``length`` positions, as indices rather than HF's int.

    With an int HF slices the hidden states into a non-contiguous view, and torch's matmul multiplies such a view
    by the ``(V, H)`` head through a batched copy of the head: 100x slower for a 49k vocabulary on CPU
    (``benchmarks/lm_head_slice.py``). Indices gather a contiguous ``(B, K, H)`` copy instead.
    """
    return torch.arange(length - count, length, device=device)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Keep the ``top_k`` largest logits (0: all) and the smallest set whose probability reaches
    ``top_p`` (1.0: all); the rest become ``-inf``. ``(B, V) -> (B, V)``; the top token always stays."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop_sorted = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p  # mass before it already enough
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@torch.no_grad()
def sample_responses(model, query_ids, query_mask, options: SamplingOptions, generator=None) -> torch.Tensor:
    """Sample up to ``options.max_new_tokens`` per left-padded query (``(B, P)`` ids and mask, the engines'
    contract: ``interface.Sampler.sample``); ``(B, R)`` ids, pad after the first eos.

    A plain loop over the model with its KV cache: for small models ``generate``'s per-step
    machinery costs more than the forward pass. Temperature 0 is greedy; top-k/top-p filter the
    distribution before sampling.
    """
    temperature, eos_token_id, pad_token_id = options.temperature, options.eos_token_id, options.pad_token_id
    batch = query_ids.shape[0]
    mask = query_mask.long()
    positions = positions_from_mask(mask)
    inputs, past = query_ids, None
    done = torch.zeros(batch, dtype=torch.bool, device=query_ids.device)
    out = []
    for _ in range(options.max_new_tokens):
        # the last position only: the prefill's logits of every prompt position would be (B, P, V) for nothing
        result = model(
            input_ids=inputs,
            attention_mask=mask,
            position_ids=positions,
            **{CACHE_ARG: past},
            use_cache=True,
            logits_to_keep=last_positions(inputs.shape[1], 1, inputs.device),
        )
        logits = result.logits[:, -1, :].float()
        past = getattr(result, CACHE_ARG)
        if temperature == 0:
            token = logits.argmax(-1)
        else:
            probs = torch.softmax(filter_logits(logits / temperature, options.top_k, options.top_p), dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        token = torch.where(done, torch.full_like(token, pad_token_id), token)
        out.append(token)
        done |= token == eos_token_id
        if bool(done.all()):
            break
        inputs = token[:, None]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
    return torch.stack(out, dim=1)


@torch.no_grad()
def generate_responses(
    model, query_ids: torch.Tensor, query_mask: torch.Tensor, options: SamplingOptions
) -> torch.Tensor:
    """The same contract as ``sample_responses`` through ``model.generate`` (for large models and
    the options the hand-written loop lacks, such as ``repetition_penalty``); draws from the global RNG."""
    sampling = (
        {"do_sample": False}
        if options.temperature == 0
        else {"do_sample": True, "temperature": options.temperature, "top_k": options.top_k, "top_p": options.top_p}
    )
    out = model.generate(
        input_ids=query_ids,
        attention_mask=query_mask,
        max_new_tokens=options.max_new_tokens,
        eos_token_id=options.eos_token_id,
        pad_token_id=options.pad_token_id,
        repetition_penalty=options.repetition_penalty,
        **sampling,
    )
    responses = out[:, query_ids.shape[1] :]
    mask = response_mask(responses, options.eos_token_id)
    return responses.masked_fill(mask == 0, options.pad_token_id)
