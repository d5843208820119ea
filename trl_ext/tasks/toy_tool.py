"""A toy tool task small enough to learn in seconds on a CPU: the docs' worked example and the learning test.

Each prompt asks for a secret digit that only the environment holds. The environment's one tool, ``lookup``,
returns it (and a small reward for the turn that called it); the answer is right when the final turn is that
digit. The model is a tiny random Qwen2 with a tokenizer of a few dozen tokens that speaks TRL's own Qwen2.5 tool
template: the template's long pieces (the system text with the tool's schema, the tool call, the tool-response
tags) are single tokens, so a random policy writes a well-formed tool call now and then, and RL can find it.
"""

from __future__ import annotations

from trl_ext.agents.templates import tool_template
from trl_ext.agents.tools import ToolResult
from trl_ext.tasks.tiny_qwen2 import tiny_qwen2, word_tokenizer

DIGITS = [str(d) for d in range(10)]
CALL = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'
QUESTION = "?"  # which digit? (one token)
LOOKUP_REWARD = 1.0  # the per-turn reward of a lookup: with a critic it lands on the calling turn's last token


class SecretDigit:
    """The environment: ``reset(secret=...)`` from the dataset row; ``lookup`` reads the secret."""

    def __init__(self):
        self.secret = None
        self.lookups = 0

    def reset(self, secret: str, **_) -> None:
        self.secret, self.lookups = secret, 0

    def lookup(self) -> str:
        """Look up the secret digit.

        Returns:
            The secret digit.
        """
        self.lookups += 1
        return ToolResult(self.secret, reward=LOOKUP_REWARD if self.lookups == 1 else 0.0)


def right_digit(completions, secret, **_) -> list[float]:
    """1.0 where the last assistant turn is the secret digit (a reward function: it sees the answer)."""
    return [
        1.0 if c[-1]["role"] == "assistant" and c[-1]["content"].strip() == s else 0.0
        for c, s in zip(completions, secret)
    ]


def lookup_tokenizer():
    """A tokenizer of the template's pieces, the digits and ChatML's special tokens, with TRL's Qwen2.5 template."""
    from tokenizers import pre_tokenizers

    tok = word_tokenizer(DIGITS + ["\n", "?"], pre_tokenizers.Split("", behavior="isolated"))
    tok.chat_template = tool_template("qwen2_5")
    pieces = [_system_text(tok), CALL, "user\n<tool_response>\n", "\n</tool_response>", "user\n", "assistant\n"]
    tok.add_tokens(pieces)
    return tok


def _system_text(tok) -> str:
    """The system turn the template writes for ``lookup``'s schema (one token in this tokenizer)."""
    text = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tools=[SecretDigit().lookup], tokenize=False
    )
    return text[len("<|im_start|>") : text.index("<|im_end|>")]


def lookup_model(tokenizer, seed: int = 0):
    """A tiny random Qwen2 for ``tokenizer``."""
    return tiny_qwen2(tokenizer, seed)


def lookup_dataset(rows: int, seed: int = 0):
    """``prompt`` (one user turn) and ``secret`` (a digit) columns."""
    import random

    from datasets import Dataset

    rng = random.Random(seed)
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": QUESTION}]] * rows,
            "secret": [rng.choice(DIGITS) for _ in range(rows)],
        }
    )
