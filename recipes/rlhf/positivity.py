"""A dense tone reward for ``trl-ext rlhf --reward-fn recipes/rlhf/positivity.py:positivity``.

A word-list sentiment score, the classic first RLHF demo (TRL's old "make the review positive"):
``(positive words - negative words) / sqrt(words)``. A plain factual answer scores near 0, a warm one 0.3-1; an
empty answer 0. Its degenerate optimum is a salad of positive words ("wonderful wonderful ..." scores 6.9 at 48
words): a run that finds it has left the language behind, which is what a KL guard is there to stop.
"""

import math
import re

from trl_ext.rewards.messages import message_text

POSITIVE = frozenset(
    """amazing awesome beautiful beneficial benefit best brilliant bright calm cheerful delightful
easy enjoy enjoyable excellent exciting fantastic fascinating fresh friendly fun glad good gorgeous grateful great
happy healthy helpful hope hopeful incredible inspiring joy joyful kind love lovely magical marvelous nice peaceful
perfect pleasant positive proud remarkable safe splendid stunning success successful superb thrilling vibrant
warm welcome wonderful wonder wow""".split()
)
NEGATIVE = frozenset(
    """angry awful bad damage danger dangerous deadly death destroy destruction devastating die
difficult disaster disease fail failure fear harm harmful hate injury kill loss pain poor problem risk sad scary
severe sick terrible threat ugly violent worse worst wrong""".split()
)
_WORD = re.compile(r"[a-z]+")


def positivity_of(text: str) -> float:
    words = _WORD.findall(text.lower())
    if not words:
        return 0.0
    tone = sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)
    return tone / math.sqrt(len(words))


def positivity(completions, **kwargs) -> list[float]:
    """TRL's reward-function signature: one score per completion."""
    return [positivity_of(message_text(c)) for c in completions]
