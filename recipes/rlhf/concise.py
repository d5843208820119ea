"""A dense brevity reward for ``trl-ext rlhf --reward-fn recipes/rlhf/concise.py:concise``: answer what was asked,
in few words.

    score = coverage - words / 48

``coverage`` is the share of the question's topic words (its words less the asking ones: "explain", "briefly",
"tell me about", ...) that the answer uses, words matched by their first five letters less a plural "s" ("tides"
by "tide", "volcanoes" by "volcano").
A rambling answer of 40 words that names the topic scores about 0.17, a sentence of 10 words 0.79, an answer off
the topic less than 0. Its degenerate optimum is the topic word alone ("Earthquakes." scores 0.98): an answer that
has stopped explaining, which is what a KL guard is there to stop.
"""

import re

from trl_ext.rewards.messages import message_text

WORDS_PER_POINT = 48
ASKING = frozenset(
    """a about an and are be brief briefly can could describe do does explain few for give how i in is
it know me of on please sentence sentences short should student students tell the to what why would you""".split()
)
_WORD = re.compile(r"[a-z0-9']+")


def stem(word: str) -> str:
    return word.removesuffix("s")[:5]


def words_of(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def topic_of(prompt: str) -> set[str]:
    return {stem(w) for w in words_of(prompt) if w not in ASKING}


def concise_score(prompt: str, answer: str) -> float:
    topic, words = topic_of(prompt), words_of(answer)
    coverage = len(topic & {stem(w) for w in words}) / len(topic) if topic else 0.0
    return coverage - len(words) / WORDS_PER_POINT


def concise(prompts, completions, **kwargs) -> list[float]:
    """TRL's reward-function signature: one score per completion, its prompt beside it. The prompt's last message
    is the question (a conversation's earlier turns are not the topic)."""
    questions = [
        p[-1]["content"] if isinstance(p, list) and p and isinstance(p[-1], dict) else message_text(p) for p in prompts
    ]
    return [concise_score(q, message_text(c)) for q, c in zip(questions, completions)]
