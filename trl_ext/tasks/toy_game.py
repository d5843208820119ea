"""A tiny model for GEM's GuessTheNumber-easy (1-10 in 4 turns), small enough to warm start and train with PPO in
seconds on a CPU: the learning test of the ``step_environment`` rollout on a real public game.

The tokenizer is word-level over what the game's strategy needs: the move's pieces (``\\boxed{``, the numbers 1-10,
``}``), the hints' words (``higher``, ``lower``) and ChatML's special tokens and role headers. Every other word of the
game's text reads as one unknown token (``?``); whitespace is dropped. The model's moves decode as they were
sampled (``\\boxed{7}``), which is all the game reads; the observations are the model's context only.
"""

from __future__ import annotations

from trl_ext.tasks.tiny_qwen2 import tiny_qwen2, word_tokenizer

WORDS = ["?", "\\boxed{", "}", *(str(n) for n in range(1, 11)), "higher", "lower"]
HEADERS = ["user\n", "assistant\n"]  # ChatML's role headers, one token each
PIECES = r"\\boxed\{|\d+|[A-Za-z]+|[^A-Za-z\d\s]"  # a move's opening, a number, a word, a sign
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GAME = "gem:game:GuessTheNumber-v0-easy"


def game_tokenizer():
    """The word-level tokenizer (unknown words: ``?``) with a ChatML template."""
    from tokenizers import Regex, pre_tokenizers

    splits = [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(PIECES), behavior="isolated")]
    tok = word_tokenizer(WORDS, pre_tokenizers.Sequence(splits))
    tok.chat_template = CHAT_TEMPLATE
    tok.add_tokens(HEADERS)
    return tok


def game_model(tokenizer, seed: int = 0, hidden_size: int = 64):
    """A tiny random Qwen2 for ``tokenizer``, 512 positions (a game of 4 turns is about 230 tokens)."""
    return tiny_qwen2(tokenizer, seed, hidden_size, positions=512)
