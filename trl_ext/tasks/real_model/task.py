"""The real-model task: write a number given in words as digits, answering with just the number.

A prompt is a TRL conversation of three turns: one worked example of the answer's form (an arithmetic
question answered with a bare number), then the question::

    {"prompt": [{"role": "user", "content": "What is 4 x 6? Answer with just the number."},
                {"role": "assistant", "content": "24"},
                {"role": "user", "content": "What is forty-seven written in digits? Answer with just the number."}],
     "answer": 47}

Numbers 1-99, four example turns: 396 prompts. The held-out set is 50 of the numbers (fixed for good) with
each example turn, 200 prompts; the training stream (seeded, endless) draws from the other 49 numbers, so the
held-out numbers are never trained on. The held-out set is the selection set: settings were chosen on it.

The test split (issue 40) is for judging settings chosen elsewhere: 60 numbers of 100-999 (fixed for good), each
with the four example turns, 240 prompts in the same format and graded by the same reward. Its numbers are outside
1-99, so no test prompt shares a number (or a text) with a training or held-out one; three-digit numbers in words are
a harder question than two-digit ones, so its scores compare rows with each other, not with held-out scores.

Why this task (measured, docs/real-model.md): SmolLM2-135M-Instruct knows the digits of a number in words
(82% bare and correct when shown two examples of the task itself) but answers this question by restating
("The number forty-seven is 47.") and, without an example turn, almost never with the bare number (about 1
in 2,500 samples at temperature 0.7: nothing for PPO to reinforce). An arithmetic example turn makes bare
answers occasional (a few percent) without teaching the task; the base model stays far below 0.5. Arithmetic
itself ("What is 7 + 5?") was rejected: bare answers are as rare, and mostly wrong when they come (the model
computes by restating "7 + 5 = 12"), so there is little to reinforce.

``JustTheNumber`` is the rule reward, in [0, 1]. Every number a completion writes must be the answer:

* 1.0   the completion is the correct number alone ("47", "47.");
* 0.5   its first line is the correct number alone and more text follows ("47\\n\\nForty-seven is ...");
* 0.25  it states the correct number among words ("The number forty-seven is 47.");
* 0.0   anything else: a wrong or second number ("46 47", "47\\n48"), the answer in words, no number.

The partial credits give sampled answers a gradient toward the bare number; nothing degenerate pays: an
empty answer, the question echoed or the words copied score 0, a list of candidates 0, and a constant number
at most 0.02 on the held-out set (each held-out number is 4 of its 200 prompts).
"""

from __future__ import annotations

import copy
import itertools
import random
import re
from collections.abc import Iterator

from trl_ext.rewards.base import RewardError, RewardFunction
from trl_ext.rewards.messages import message_text
from trl_ext.tasks.real_model.splits import by_name, held_out, rest

INSTRUCTION = "Answer with just the number."
QUESTION = "What is {words} written in digits?"
# The example turns: another task (arithmetic), so that they show the answer's form without its content.
EXAMPLES = (("What is 2 + 3?", "5"), ("What is 4 x 6?", "24"), ("What is 9 + 8?", "17"), ("What is 10 - 7?", "3"))
NUMBERS = range(1, 100)
HELDOUT_NUMBERS = 50
HELDOUT_SIZE = HELDOUT_NUMBERS * len(EXAMPLES)
SPLIT_SEED = 31  # fixes the held-out numbers for good (tests pin them); the training seed only orders the stream
TEST_RANGE = range(100, 1000)  # outside NUMBERS: the test split shares no number with training or held-out rows
TEST_NUMBERS = 60
TEST_SIZE = TEST_NUMBERS * len(EXAMPLES)
TEST_SPLIT_SEED = 40  # fixes the test numbers for good (issue 40; tests pin them)

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_QUESTION = re.compile(r"What is ([a-z]+(?:[ -][a-z]+)*) written in digits\?")
# A number, with its minus sign only where the sign is not a hyphen between words or digits ("7-5", "x-5").
_NUMBER = re.compile(r"(?:(?<!\w)-)?\d+(?:\.\d+)?")
_BARE = re.compile(r"-?\d+(?:\.\d+)?\.?")
_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]+\|>")  # "<|im_end|>": a completion decoded with special tokens ends there


def number_words(n: int) -> str:
    """0-999 in English words, without "and": 7 -> 'seven', 47 -> 'forty-seven', 347 -> 'three hundred forty-seven'."""
    if not 0 <= n < 1000:
        raise ValueError(f"number_words covers 0-999, got {n}")
    if n >= 100:
        return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_words(n % 100))
    if n < 20:
        return _ONES[n]
    return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])


_WORDS_TO_NUMBER = {number_words(n): n for n in range(1000)}


def _row(n: int, example: int) -> dict:
    question, answer = EXAMPLES[example]
    return {
        "prompt": [
            {"role": "user", "content": f"{question} {INSTRUCTION}"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"{QUESTION.format(words=number_words(n))} {INSTRUCTION}"},
        ],
        "answer": n,
    }


def heldout_numbers() -> list[int]:
    return held_out(NUMBERS, HELDOUT_NUMBERS, SPLIT_SEED)


def train_numbers() -> list[int]:
    return rest(NUMBERS, heldout_numbers())


def _test_numbers() -> list[int]:
    """The test split's 60 numbers, drawn once from 100-999. (Private: pytest would collect a public ``test_*``
    function imported into a test module; ``eval_numbers("test")`` is the public name.)"""
    return sorted(random.Random(TEST_SPLIT_SEED).sample(TEST_RANGE, TEST_NUMBERS))


def all_rows() -> list[dict]:
    """Every prompt of training and selection (396: the numbers 1-99), in a fixed order; not the test split."""
    return [_row(n, e) for n in NUMBERS for e in range(len(EXAMPLES))]


def heldout_rows() -> list[dict]:
    """The fixed held-out set: 200 prompts, 50 numbers the training stream never asks for."""
    return [_row(n, e) for n in heldout_numbers() for e in range(len(EXAMPLES))]


SPLITS = {"heldout": heldout_numbers, "test": _test_numbers}  # evaluation splits by name -> their numbers


def eval_numbers(split: str) -> list[int]:
    """The numbers of an evaluation split: ``heldout`` (50 of 1-99, the selection set) or ``test`` (60 of
    100-999)."""
    return by_name(SPLITS, split)


def eval_rows(split: str) -> list[dict]:
    """An evaluation split's prompts: each of its numbers after each example turn (``heldout``: 200, the selection
    set, equal to ``heldout_rows()``; ``test``: 240, judged on once the settings are fixed)."""
    return [_row(n, e) for n in eval_numbers(split) for e in range(len(EXAMPLES))]


def train_rows() -> list[dict]:
    """The 196 prompts the training stream draws from, in a fixed order."""
    return [_row(n, e) for n in train_numbers() for e in range(len(EXAMPLES))]


def train_stream(seed: int) -> Iterator[dict]:
    """Endless training prompts: the training rows, reshuffled every pass by a ``seed``-ed generator."""
    rows, rng = train_rows(), random.Random(seed)
    while True:
        order = list(range(len(rows)))
        rng.shuffle(order)
        for i in order:
            yield copy.deepcopy(rows[i])  # a caller may edit its rows


def train_dataset(n: int, seed: int):
    """The first ``n`` prompts of ``train_stream(seed)`` as a ``datasets.Dataset`` (what trainers take)."""
    from datasets import Dataset

    return Dataset.from_list(list(itertools.islice(train_stream(seed), n)))


def heldout_dataset():
    from datasets import Dataset

    return Dataset.from_list(heldout_rows())


def eval_dataset(split: str):
    from datasets import Dataset

    return Dataset.from_list(eval_rows(split))


def parse_question(prompt) -> int:
    """The answer to the task's question in a prompt (messages, or text such as a rendered chat)."""
    matches = _QUESTION.findall(message_text(prompt))
    if not matches or matches[-1] not in _WORDS_TO_NUMBER:  # the last: the question follows the example turn
        raise RewardError(
            f"no 'What is <number in words> written in digits?' question in the prompt {message_text(prompt)[-120:]!r}"
        )
    return _WORDS_TO_NUMBER[matches[-1]]


class JustTheNumber(RewardFunction):
    """The task's rule reward (grades in the module's docstring). Picklable; TRL's reward-function signature.

    Reads the ``answer`` dataset column when given, else parses the question in the prompt.
    """

    name = "just_the_number"
    GRADES = ("alone", "first_line", "stated", "none")

    def __init__(self, first_line: float = 0.5, stated: float = 0.25):
        if not 0 <= stated <= first_line <= 1:
            raise RewardError(f"need 0 <= stated <= first_line <= 1; got stated={stated}, first_line={first_line}")
        self.credit = {"alone": 1.0, "first_line": float(first_line), "stated": float(stated), "none": 0.0}

    @staticmethod
    def grade(completion, answer: int) -> str:
        """Which grade a completion earns: ``alone``, ``first_line``, ``stated`` or ``none``."""
        text = _SPECIAL.split(message_text(completion), maxsplit=1)[0].strip()
        numbers = [float(n) for n in _NUMBER.findall(text)]
        if not numbers or any(v != answer for v in numbers):
            return "none"
        if _BARE.fullmatch(text):
            return "alone"
        if _BARE.fullmatch(text.split("\n", 1)[0].strip()):
            return "first_line"
        return "stated"

    def score(self, prompts, completions, **columns):
        answers = columns.get("answer")
        if answers is None:
            answers = [parse_question(p) for p in prompts]
        return [self.credit[self.grade(c, a)] for c, a in zip(completions, answers)]


just_the_number = JustTheNumber()  # ``--reward-fn trl_ext.tasks.real_model.task:just_the_number``
