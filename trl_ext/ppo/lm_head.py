"""The log-probs (and entropy) of the response tokens a causal LM gives, the one way every pass computes them: through
the model's own head (the logits of the kept positions), or with ``chunked_lm_head`` from the last hidden states, the
LM head applied inside a chunk of positions at a time: no ``(B, R, V)`` logits exist in a pass, with gradients or
without, and the graph keeps the hidden states instead (896 values a position for a 0.5B Qwen, not 151,936).

It stands in for the model's own ``lm_head(hidden)``, so it is taken only where that is all the model does to its
last hidden states: the architectures named below (no logit scaling or soft-capping), with an ``nn.Linear`` head
that no adapter wraps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trl_ext.errors import InputError
from trl_ext.ppo import core

# Causal LMs whose logits are exactly ``lm_head(last_hidden_state)``.
PLAIN_HEAD_MODELS = ("gpt2", "llama", "mistral", "qwen2", "qwen3")
# Logits a chunk of the head holds: about 220 positions of a 150k vocabulary on a GPU (a small matmul costs nearly
# what a large one does there; its float32 working copies stay near 0.5 GB), about 110 on CPU.
CHUNK_ELEMENTS = {"cuda": 2**25, "cpu": core.CHUNK_ELEMENTS}


@dataclass(frozen=True)
class TokenLogprobs:
    """What a pass returns in place of logits: the log-probs of ``tokens`` ``(B, R)``, the responses, and with
    ``entropy`` the policy's entropy at each (its gradient kept with ``entropy_grad``); ``chunked``: from the hidden
    states (``chunked_lm_head``)."""

    tokens: torch.Tensor
    temperature: float = 1.0
    entropy: bool = False
    entropy_grad: bool = False
    chunked: bool = False


def _unwrapped(causal_lm):
    return causal_lm.get_base_model() if hasattr(causal_lm, "get_base_model") else causal_lm


def backbone(causal_lm):
    """The transformer under the LM head (``model.transformer`` for GPT-2, ``model.model`` for Qwen), a PEFT model's
    LoRA layers included (its own ``base_model_prefix`` attribute would be the whole causal LM)."""
    model = _unwrapped(causal_lm)
    return getattr(model, model.base_model_prefix)


def token_logprobs(
    causal_lm, inputs: dict, logits_to_keep: torch.Tensor, request: TokenLogprobs, hidden: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(log-probs, entropy or None, last hidden states (B, L, H) if hidden else None)`` of ``causal_lm`` over
    ``inputs``; ``logits_to_keep``: the indices of the positions that predict the responses, and the last (dropped),
    as ``ForwardPasses.kept_positions`` gives them."""
    if not isinstance(logits_to_keep, torch.Tensor):
        raise InputError("token_logprobs takes logits_to_keep as the kept positions' indices")
    if request.chunked:
        last = backbone(causal_lm)(**inputs).last_hidden_state
        return *_chunked_head(causal_lm, last[:, logits_to_keep[:-1]], request), last if hidden else None
    out = causal_lm(**inputs, output_hidden_states=hidden, logits_to_keep=logits_to_keep)
    logits = out.logits[:, :-1]
    logprobs = core.logprobs_from_logits(logits, request.tokens, request.temperature)
    entropy = None
    if request.entropy:
        with torch.set_grad_enabled(request.entropy_grad and torch.is_grad_enabled()):
            entropy = core.entropy_from_logits(logits, request.temperature)
    return logprobs, entropy, out.hidden_states[-1] if hidden else None


def check_plain_head(causal_lm) -> None:
    """One line naming what stops ``chunked_lm_head`` for this model, else nothing."""
    model = _unwrapped(causal_lm)
    kind = getattr(model.config, "model_type", None)
    head = model.get_output_embeddings()
    if kind not in PLAIN_HEAD_MODELS:
        raise InputError(
            f"chunked_lm_head computes logits as the LM head does for {', '.join(PLAIN_HEAD_MODELS)} models; "
            f"this policy is a {kind!r} model ({type(model).__name__}): leave chunked_lm_head off"
        )
    if type(head) is not nn.Linear:
        raise InputError(
            f"chunked_lm_head needs the policy's LM head to be a plain nn.Linear; it is a {type(head).__name__} "
            "(an adapter on lm_head?): leave lm_head out of the adapter's target modules, or chunked_lm_head off"
        )


def _chunked_head(causal_lm, hidden: torch.Tensor, request: TokenLogprobs):
    """``hidden`` ``(B, R, H)``: the states that predict the responses."""
    head = _unwrapped(causal_lm).get_output_embeddings()
    return logprobs_from_hidden(
        hidden,
        head.weight,
        head.bias,
        request.tokens,
        request.temperature,
        entropy=request.entropy,
        entropy_grad=request.entropy_grad,
        chunk_elements=CHUNK_ELEMENTS.get(hidden.device.type, core.CHUNK_ELEMENTS),
    )


def logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    *,
    entropy: bool = False,
    entropy_grad: bool = False,
    chunk_elements: int = core.CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``core.logprobs_from_logits(hidden @ weight.T + bias, tokens, temperature)`` and, with ``entropy``, the
    per-token entropy: ``(B, T, H), (V, H), (B, T) -> (B, T)`` each in float32, without the ``(B, T, V)`` logits. The
    linear head runs on rows of positions at a time (``chunk_elements`` logits); with gradients each chunk's logits
    are recomputed in the backward pass, so the graph holds the hidden states alone. The entropy's gradient is kept
    only with ``entropy_grad``."""
    rows = max(1, chunk_elements // weight.shape[0])
    flat = hidden.reshape(-1, hidden.shape[-1])
    parts = []
    for chunk, ids in zip(flat.split(rows), tokens.reshape(-1).split(rows)):
        grad = torch.is_grad_enabled() and (chunk.requires_grad or weight.requires_grad)
        step = (lambda *a: checkpoint(_head_chunk, *a, use_reentrant=False)) if grad else _head_chunk
        parts.append(step(chunk, weight, bias, ids, temperature, entropy, entropy_grad))
    logprobs = torch.cat([p[0] for p in parts]).reshape(tokens.shape)
    return logprobs, torch.cat([p[1] for p in parts]).reshape(tokens.shape) if entropy else None


def _head_chunk(chunk, weight, bias, ids, temperature, entropy, entropy_grad):
    logits = torch.nn.functional.linear(chunk, weight, bias)
    picked = core.selected_logprobs(logits, ids, temperature)
    if not entropy:
        return picked, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        return picked, core.token_entropy(logits, temperature)
