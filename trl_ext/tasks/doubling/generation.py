"""Batched generation of completions for prompt strings."""

from __future__ import annotations

import torch

from trl_ext.data.batching import pad_batch
from trl_ext.data.sequences import completion_token_ids, response_mask


def completion_texts(tokenizer, response_ids: torch.Tensor) -> list[str]:
    """Decode generated ids up to and including the first eos token; what follows it is dropped."""
    ids = completion_token_ids(response_ids, response_mask(response_ids, tokenizer.eos_token_id))
    return tokenizer.batch_decode(ids, skip_special_tokens=False)


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    *,
    do_sample: bool,
    seed: int = 0,
    max_new_tokens: int = 8,
    batch_size: int = 500,
    temperature: float = 1.0,
) -> list[str]:
    """Complete each prompt; greedy or sampled at ``temperature`` with full top-k/top-p (seeded)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    texts: list[str] = []
    # fork_rng restores the CPU *and* CUDA generators afterwards: a probe mid-run must not change
    # the training run's own sampling (manual_seed reseeds CUDA too).
    try:
        cuda_devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda_devices):
            torch.manual_seed(seed)
            for start in range(0, len(prompt_ids), batch_size):
                ids, mask = pad_batch(prompt_ids[start : start + batch_size], tokenizer.pad_token_id, side="left")
                sampling = (
                    {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                    if do_sample
                    else {"do_sample": False}
                )
                out = model.generate(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    max_new_tokens=max_new_tokens,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                    **sampling,
                )
                texts.extend(completion_texts(tokenizer, out[:, ids.shape[1] :]))
    finally:
        model.train(was_training)
    return texts
