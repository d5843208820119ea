"""The doubling task: ``S数字:3320x2=`` -> ``6640E``.

A question is a number 1000-9999; the answer is twice it, written in one of three
character sets (label 0 digits, 1 lower-case numerals, 2 upper-case numerals). A
prompt asks for a set through its prefix (``数字``/``小写``/``大写``) or for none
(``__``, the pretraining data). Everything here is plain data: strings, ints and
``datasets.Dataset`` objects.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from datasets import Dataset

from trl_ext.errors import InputError

PAD, BOS, EOS = "P", "S", "E"
DIGITS = "0123456789"
LOWER = "〇一二三四五六七八九"
UPPER = "零壹贰叁肆伍陆柒捌玖"
OTHER = "数字大写小:=_x"
# The seed's vocabulary, in the seed's order: ids are positions in this string.
VOCAB = PAD + BOS + EOS + DIGITS + LOWER + UPPER + OTHER

CHARSETS = (DIGITS, LOWER, UPPER)
CHARSET_NAMES = ("digits", "lower", "upper")
PREFIXES = ("数字", "小写", "大写")
NO_PREFIX = "__"
NUM_LABELS = 4  # the seed's classifier head has 4 outputs
# Its fourth: an answer that mixes character sets. A classifier trained on pure answers alone scores "10捌捌零E" for
# upper case as high as "壹零捌捌零E", and PPO finds that hole (docs/decisions.md, "Why a run settles").
MIXED_LABEL = 3
MIXED_SHARE = 0.25  # of the classifier's rows
# Pretraining on no-prefix rows alone leaves the prefix tokens untrained: one policy in two then doubled wrongly after
# them (greedy value accuracy 0.958 on prefixed prompts, 1.0 without), a cap the charset reward cannot lift.
PREFIXED_SHARE = 0.5

QUESTION_MIN, QUESTION_MAX = 1000, 9999
HELD_OUT_SIZE = 1000
_SPLIT_SEED = 20240601  # fixes which questions are held out, independent of any run seed

_CHAR_TO_DIGIT = {ch: d for charset in CHARSETS for d, ch in enumerate(charset)}
_CHAR_TO_LABEL = {ch: label for label, charset in enumerate(CHARSETS) for ch in charset}


def check_text(text: str) -> None:
    """Raise ValueError naming the first character outside the vocabulary and its position."""
    if not isinstance(text, str):
        raise TypeError(f"expected a string, got {type(text).__name__}")
    for position, ch in enumerate(text):
        if ch not in VOCAB:
            raise InputError(f"character {ch!r} at position {position} of {text!r} is not in the doubling vocabulary")


def _split_questions() -> tuple[list[int], list[int]]:
    questions = list(range(QUESTION_MIN, QUESTION_MAX + 1))
    random.Random(_SPLIT_SEED).shuffle(questions)
    return sorted(questions[HELD_OUT_SIZE:]), sorted(questions[:HELD_OUT_SIZE])


TRAIN_QUESTIONS, HELD_OUT_QUESTIONS = _split_questions()


def spell(number: int, label: int) -> str:
    """Write ``number`` in the character set of ``label``."""
    return "".join(CHARSETS[label][int(d)] for d in str(number))


@dataclass(frozen=True)
class Sample:
    question: int
    label: int
    prefixed: bool

    @property
    def prompt(self) -> str:
        prefix = PREFIXES[self.label] if self.prefixed else NO_PREFIX
        return f"{BOS}{prefix}:{self.question}x2="

    @property
    def answer(self) -> str:
        return spell(2 * self.question, self.label) + EOS

    @property
    def text(self) -> str:
        return self.prompt + self.answer


def generate_samples(n: int, seed: int, split: str = "train", prefixed: bool = False) -> list[Sample]:
    """``n`` samples drawn with ``random.Random(seed)``: same arguments, same samples.

    ``split="train"`` draws questions from the 8,000 training questions, ``"heldout"``
    from the 1,000 held-out ones; the two never share a question.
    """
    if n <= 0:
        raise InputError(f"n must be positive, got {n}")
    pools = {"train": TRAIN_QUESTIONS, "heldout": HELD_OUT_QUESTIONS}
    if split not in pools:
        raise InputError(f"split must be one of {sorted(pools)}, got {split!r}")
    rng = random.Random(seed)
    pool = pools[split]
    return [Sample(rng.choice(pool), rng.randrange(len(CHARSETS)), prefixed) for _ in range(n)]


def check_held_out(name: str, n: int) -> None:
    """Refuse ``n`` (the option ``name``) unless that many held-out questions exist."""
    if not 0 < n <= HELD_OUT_SIZE:
        raise InputError(f"{name} must be in 1..{HELD_OUT_SIZE} (the held-out questions), got {n}")


def heldout_prompts(n: int = HELD_OUT_SIZE, seed: int = 0) -> list[Sample]:
    """The first ``n`` held-out questions, each once, with seeded labels: the evaluation set."""
    check_held_out("n", n)
    rng = random.Random(seed)
    questions = list(HELD_OUT_QUESTIONS)
    rng.shuffle(questions)
    return [Sample(q, rng.randrange(len(CHARSETS)), True) for q in questions[:n]]


_CHAR_IDS = {ch: i for i, ch in enumerate(VOCAB)}


def _tokenize(tokenizer, texts: list[str]) -> list[list[int]]:
    for text in texts:
        check_text(text)
    if tokenizer.get_vocab() == _CHAR_IDS:
        # The task's own one-token-a-character tokenizer: its regex pre-tokenizer cost 3-5 s on the 160,000
        # pretraining texts, a dict lookup a tenth of that (the same ids: tests/test_doubling_task.py).
        return [[_CHAR_IDS[ch] for ch in text] for text in texts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def pretrain_dataset(tokenizer, n: int, seed: int, prefixed_share: float = PREFIXED_SHARE) -> Dataset:
    """Full sequences for next-token pretraining: no-prefix (``S__:1234x2=2468E``), and a ``prefixed_share`` under a
    prefix drawn apart from the answer's set (``S大写:1234x2=2468E``), so the prefix says nothing yet."""
    samples = generate_samples(n, seed, "train", prefixed=False)
    rng = random.Random(f"prefixes-{seed}")  # its own stream: the rows are those of the same seed without it
    texts = [
        (f"{BOS}{rng.choice(PREFIXES)}:{s.question}x2={s.answer}" if rng.random() < prefixed_share else s.text)
        for s in samples
    ]
    return Dataset.from_dict({"text": texts, "input_ids": _tokenize(tokenizer, texts)})


def mixed_answer(question: int, label: int, rng: random.Random) -> str:
    """Twice ``question`` in the set of ``label`` with 1 to all-but-one of its characters in another set."""
    digits = str(2 * question)
    other = rng.choice([lab for lab in range(len(CHARSETS)) if lab != label])
    swapped = set(rng.sample(range(len(digits)), rng.randint(1, len(digits) - 1)))
    return "".join(CHARSETS[other if i in swapped else label][int(d)] for i, d in enumerate(digits)) + EOS


def classifier_dataset(tokenizer, n: int, seed: int, split: str = "train", mixed_share: float = MIXED_SHARE) -> Dataset:
    """No-prefix full sequences with the answer's character set as ``label``; a ``mixed_share`` of them mix two
    sets and are labelled ``MIXED_LABEL``."""
    samples = generate_samples(n, seed, split, prefixed=False)
    rng = random.Random(f"mixed-{seed}")  # its own stream: the pure rows are those of the same seed without it
    texts, labels = [], []
    for s in samples:
        if rng.random() < mixed_share:
            texts.append(s.prompt + mixed_answer(s.question, s.label, rng))
            labels.append(MIXED_LABEL)
        else:
            texts.append(s.text)
            labels.append(s.label)
    return Dataset.from_dict({"text": texts, "input_ids": _tokenize(tokenizer, texts), "label": labels})


def prompt_dataset(tokenizer, samples: list[Sample]) -> Dataset:
    """Prefix prompts ending in ``=`` with ``input_ids``, ``label``, ``question`` and the expected ``answer``."""
    prompts = [s.prompt for s in samples]
    return Dataset.from_dict(
        {
            "prompt": prompts,
            "input_ids": _tokenize(tokenizer, prompts),
            "label": [s.label for s in samples],
            "question": [s.question for s in samples],
            "answer": [s.answer for s in samples],
        }
    )


def ppo_prompt_dataset(tokenizer, n: int, seed: int) -> Dataset:
    """Training prompts for PPO: prefixed, from the training questions."""
    return prompt_dataset(tokenizer, generate_samples(n, seed, "train", prefixed=True))


def eval_prompt_dataset(tokenizer, n: int = HELD_OUT_SIZE, seed: int = 0) -> Dataset:
    return prompt_dataset(tokenizer, heldout_prompts(n, seed))


# ----------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class ParsedPrompt:
    question: int
    label: int | None  # None for the no-prefix ``__`` prompts


def parse_prompt(prompt: str) -> ParsedPrompt:
    """``S数字:3320x2=`` -> question 3320, label 0. Raises ValueError naming a malformed prompt."""
    body = prompt[1:] if prompt.startswith(BOS) else prompt
    head, sep, rest = body.partition(":")
    if not sep or not rest.endswith("x2=") or not rest[:-3].isdigit() or not rest[:-3].isascii():
        raise InputError(f"malformed doubling prompt {prompt!r}: expected like 'S数字:3320x2='")
    if head == NO_PREFIX:
        label = None
    elif head in PREFIXES:
        label = PREFIXES.index(head)
    else:
        raise InputError(f"unknown prefix {head!r} in prompt {prompt!r}: expected one of {PREFIXES + (NO_PREFIX,)}")
    return ParsedPrompt(int(rest[:-3]), label)


@dataclass(frozen=True)
class ParsedAnswer:
    """What a completion says. ``value``/``charset`` are None where they cannot be read."""

    body: str  # the text before the first E (or all of it)
    finished: bool  # an E ends the answer
    value: int | None  # the number written, in whatever character sets
    charset: int | None  # the one character set used throughout, None if mixed/empty/other chars


def parse_answer(completion: str) -> ParsedAnswer:
    body, eos, _ = completion.partition(EOS)
    digits = [_CHAR_TO_DIGIT.get(ch) for ch in body]
    value = None
    if body and None not in digits and (len(digits) == 1 or digits[0] != 0):
        value = int("".join(map(str, digits)))
    labels = {_CHAR_TO_LABEL.get(ch) for ch in body}
    charset = labels.pop() if len(labels) == 1 and None not in labels else None
    return ParsedAnswer(body, bool(eos), value, charset)


def expected_answer(question: int, label: int) -> str:
    return spell(2 * question, label) + EOS


def truncate_completion(completion: str) -> str:
    """The completion up to and including its first E, as the seed compares answers."""
    body, eos, _ = completion.partition(EOS)
    return body + eos
