"""A dense style reward for ``trl-ext rlhf --reward-fn recipes/rlhf/readability.py:reading_ease``.

Flesch reading ease of the answer, divided by 100: ``(206.835 - 1.015 * words/sentences - 84.6 *
syllables/words) / 100``. Plain English scores 0.6-0.8, dense prose below 0.3. Shorter sentences and shorter
words raise it, so it teaches plainer answers; its degenerate optimum is a one-word answer ("Yes." scores
1.21), which is what a recipe without a KL guard collapses to. An empty answer scores 0.
"""

import re

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_SENTENCE_END = re.compile(r"[.!?]+")
_VOWEL_GROUP = re.compile(r"[aeiouy]+")


def syllables(word: str) -> int:
    """Vowel groups, a silent final 'e' not counted; at least one."""
    word = word.lower()
    count = len(_VOWEL_GROUP.findall(word))
    if word.endswith("e") and not word.endswith(("le", "ee")) and count > 1:
        count -= 1
    return max(1, count)


def reading_ease_of(text: str) -> float:
    words = _WORD.findall(text)
    if not words:
        return 0.0
    sentences = max(1, len(_SENTENCE_END.findall(text.strip() + ("" if text.strip()[-1:] in ".!?" else "."))))
    per_word = sum(syllables(w) for w in words) / len(words)
    return (206.835 - 1.015 * len(words) / sentences - 84.6 * per_word) / 100


def _text(completion) -> str:
    """TRL hands a completion as text or as a list of messages (conversational prompts)."""
    if isinstance(completion, str):
        return completion
    return "\n".join(str(message.get("content", "")) for message in completion)


def reading_ease(completions, **kwargs) -> list[float]:
    """TRL's reward-function signature: one score per completion."""
    return [reading_ease_of(_text(c)) for c in completions]
