"""The worked tasks' tiny models (the tool task's, the game's): a word-level tokenizer with ChatML's special tokens,
and a random Qwen2 for it (two layers, four heads of which two key-value heads, untied embeddings)."""

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def word_tokenizer(words: list[str], pre_tokenizer):
    """A tokenizer of ``SPECIALS`` and ``words`` (unknown text: ``?``, which ``words`` must hold), split by
    ``pre_tokenizer``, pad ``<|endoftext|>``, eos ``<|im_end|>``; the caller sets its chat template."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({token: i for i, token in enumerate(SPECIALS + words)}, unk_token="?"))
    core.pre_tokenizer = pre_tokenizer
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token="?",
        additional_special_tokens=SPECIALS[1:],
    )


def tiny_qwen2(tokenizer, seed: int = 0, hidden_size: int = 32, positions: int = 128):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=positions,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None,
            tie_word_embeddings=False,
        )
    )
