"""Log-probs of the response tokens from the last hidden states, the LM head applied inside a chunk of positions at a
time (``chunked_lm_head``): no ``(B, R, V)`` logits exist in a pass, with gradients or without, and the graph keeps
the hidden states instead (896 values a position for a 0.5B Qwen, not 151,936).

It stands in for the model's own ``lm_head(hidden)``, so it is taken only where that is all the model does to its
last hidden states: the architectures named below (no logit scaling or soft-capping), with an ``nn.Linear`` head
that no adapter wraps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

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
    ``entropy`` the policy's entropy at each (its gradient kept with ``entropy_grad``)."""

    tokens: torch.Tensor
    temperature: float = 1.0
    entropy: bool = False
    entropy_grad: bool = False


def _unwrapped(causal_lm):
    return causal_lm.get_base_model() if hasattr(causal_lm, "get_base_model") else causal_lm


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


def response_logprobs(
    causal_lm, hidden: torch.Tensor, logits_to_keep: torch.Tensor, request: TokenLogprobs
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log-probs, entropy or None)``, each ``(B, R)``: ``hidden`` ``(B, L, H)`` the last hidden states,
    ``logits_to_keep`` the positions the logits would have been kept at (the R that predict the responses and the
    last, dropped), as ``ForwardPasses.kept_positions`` gives them."""
    head = _unwrapped(causal_lm).get_output_embeddings()
    at = hidden[:, logits_to_keep[:-1]]
    return core.logprobs_from_hidden(
        at,
        head.weight,
        head.bias,
        request.tokens,
        request.temperature,
        entropy=request.entropy,
        entropy_grad=request.entropy_grad,
        chunk_elements=CHUNK_ELEMENTS.get(hidden.device.type, core.CHUNK_ELEMENTS),
    )
