"""The seed's tiny models, built from configs (nothing is downloaded)."""

from __future__ import annotations

from transformers import BertConfig, BertForSequenceClassification, GenerationConfig, GPT2Config, GPT2LMHeadModel

from trl_ext.tasks.doubling.task import NUM_LABELS


def _special_token_ids(tokenizer) -> dict:
    return dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )


def build_policy(tokenizer, seed: int = 0) -> GPT2LMHeadModel:
    """Seed 000's GPT-2: 64 wide, 4 layers, 4 heads, 128 positions (210,944 parameters)."""
    import torch

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=64,
        n_head=4,
        n_layer=4,
        n_positions=128,
        **_special_token_ids(tokenizer),
        # The exact (erf) GELU: torch's CPU kernel for it is vectorised, the tanh approximation GPT-2
        # uses is not (0.9 ms against 6.2 ms forward and backward on a pretraining step's activations,
        # a tenth of the step); the two functions differ by under 1e-3.
        activation_function="gelu",
    )
    model = GPT2LMHeadModel(config)
    model.generation_config = GenerationConfig(**_special_token_ids(tokenizer))
    return model


def build_classifier(tokenizer, seed: int = 0, num_labels: int = NUM_LABELS) -> BertForSequenceClassification:
    """Seed 000's BERT reward classifier: hidden 64, 4 layers, 4 heads, intermediate 64, 4 labels
    (``num_labels=1``: the same network as a scalar reward model)."""
    import torch

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=128,
        type_vocab_size=1,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
    )
    return BertForSequenceClassification(config)
