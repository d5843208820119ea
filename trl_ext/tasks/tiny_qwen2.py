"""A tiny random Qwen2 for a worked task's own tokenizer (the tool task's, the game's): two layers, four heads of
which two key-value heads, untied embeddings."""


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
