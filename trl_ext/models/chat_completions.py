"""Chat completions for evaluation: each conversation through the tokenizer's chat template with the generation
prompt (as TRL's trainers render conversations), greedy or sampled, decoded without special tokens."""

from __future__ import annotations

import torch


@torch.no_grad()
def generate(
    model,
    tokenizer,
    conversations: list,
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 48,
    batch_size: int = 50,
    seed: int = 0,
    max_prompt_length: int | None = None,
) -> list[str]:
    """One completion per conversation: greedy when ``temperature`` is 0, else sampled from the whole
    distribution (no top-k/top-p: the trainers' default) with ``torch.manual_seed(seed)``. With
    ``max_prompt_length``, each templated prompt keeps its last that many tokens, as training cuts them."""
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    sampling = (
        dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        if temperature > 0
        else dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    )
    torch.manual_seed(seed)
    texts = []
    try:
        for start in range(0, len(conversations), batch_size):
            batch = tokenizer.apply_chat_template(
                conversations[start : start + batch_size],
                add_generation_prompt=True,
                padding=True,
                return_tensors="pt",
                return_dict=True,
            )
            # Left-padded: the last columns hold every prompt's last tokens.
            cut = -max_prompt_length if max_prompt_length else None
            batch = {k: v[:, cut:].to(model.device) for k, v in batch.items()}
            out = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **sampling,
            )
            texts += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return texts
