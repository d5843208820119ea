"""Train streams that hold none of a test set's questions, for reasoning-gym's tasks.

Train and test streams never share a generator seed (``trl_ext.data.reasoning_gym``), but they can share questions:
at easy settings a task makes only a few hundred distinct questions (``chain_sum`` with two one-digit terms makes
200), so a long train stream repeats most of a test stream's questions word for word. Here a question is the text of a
row's user turn (the system prompt aside), compared exactly.

``distinct_questions`` estimates how many questions a setting can make; ``train_excluding`` is a train stream with
every question of a test set left out, kept at its size by drawing further items, and refused where the setting makes
too few questions beyond the test set's; ``question_overlap`` counts the test rows whose question a train set holds
(what a run records: 0 after ``train_excluding``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from trl_ext.data import reasoning_gym as rg
from trl_ext.errors import InputError

CHUNK = 512  # items drawn at a time by distinct_questions; a chunk with no new question ends the draws
DRAWS = 4096  # distinct_questions' default ceiling: about 0.05 s for the arithmetic tasks
DRAWS_PER_ROW = 10  # train_excluding's default ceiling: 10 items of the stream for each row asked for


@dataclass(frozen=True)
class QuestionCount:
    """What ``distinct_questions`` drew and what it estimates."""

    estimate: int  # the distinct questions the setting can make (Chao1, below)
    seen: int  # the distinct questions among the draws
    draws: int  # the items drawn

    @property
    def saturated(self) -> bool:
        """Every question the setting makes was seen, as far as the draws can tell (no question seen only once)."""
        return self.estimate == self.seen


def distinct_questions(
    spec: str, task_configs: Mapping[str, Mapping] | None = None, draws: int = DRAWS, seed: int = 0
) -> QuestionCount:
    """How many distinct questions the task or mix ``spec`` makes at ``task_configs``.

    Method: the items of the train stream of ``seed``, drawn ``CHUNK`` at a time until a chunk brings no question not
    seen before or ``draws`` items are drawn, then Chao's bias-corrected estimator ``S + f1 (f1 - 1) / (2 (f2 + 1))``
    (Chao 1987; S the distinct questions seen, f1 and f2 those seen once and twice).

    Limits: where the draws saturate (a few hundred questions, as at easy settings) it is the count, bar questions
    rarer than about one in ``draws``; where questions are not equally likely it is a lower bound in expectation (as
    Chao1 is). Where the draws repeat little (a setting of many thousand questions) it says only "far more than the
    draws": with no repeat at all it is ``draws * (draws - 1) / 2``. Cost: at most ``draws`` items, no rows built.
    """
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise InputError(f"distinct_questions: draws must be a positive integer, got {draws!r}")
    counts: Counter[str] = Counter()
    drawn = 0
    while drawn < draws:
        chunk = min(CHUNK, draws - drawn)
        before = len(counts)
        counts.update(rg.question_texts(spec, chunk, seed + drawn, "train", task_configs))  # the stream, chunk by chunk
        drawn += chunk
        if len(counts) == before:
            break
    frequencies = Counter(counts.values())
    once, twice = frequencies[1], frequencies[2]
    return QuestionCount(len(counts) + once * (once - 1) // (2 * (twice + 1)), len(counts), drawn)


def prompt_questions(rows) -> list[str]:
    """The question of each row of a prompt dataset (a ``datasets.Dataset`` or a dict of columns): its prompt's last
    user turn (a conversation), or the prompt itself (a text prompt)."""
    questions = []
    for prompt in rows["prompt"]:
        if isinstance(prompt, str):
            questions.append(prompt)
        else:
            questions.append(next((m["content"] for m in reversed(prompt) if m["role"] == "user"), ""))
    return questions


def question_overlap(train, test) -> int:
    """How many of ``test``'s rows ask a question that one of ``train``'s rows asks (prompt datasets, as
    ``prompt_questions`` reads them): a test prompt the policy may have trained on."""
    seen = set(prompt_questions(train))
    return sum(question in seen for question in prompt_questions(test))


def train_excluding(
    spec: str,
    size: int,
    exclude,
    seed: int = 0,
    system_prompt: str | None = rg.DEFAULT_SYSTEM_PROMPT,
    task_configs: Mapping[str, Mapping] | None = None,
    answer_format: str = "tags",
    max_draws: int | None = None,
):
    """``reasoning_gym_dataset(spec, size, seed, "train", ...)`` without the rows whose question ``exclude`` (a
    prompt dataset: the test rows) asks, drawn further to keep ``size`` rows: the stream's items in order, the
    excluded ones skipped, so ``question_overlap(result, exclude) == 0``.

    Refused (one ``InputError`` naming the task and the counts) where the first ``max_draws`` items of the stream
    (default ``DRAWS_PER_ROW`` x ``size``) hold fewer than ``size`` rows outside ``exclude``: the setting makes too
    few questions beyond the test set's. A harder setting, fewer rows or a smaller test set is the way out.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"reasoning-gym dataset size must be a positive integer, got {size!r}")
    banned = set(prompt_questions(exclude))
    limit = max(size, DRAWS_PER_ROW * size if max_draws is None else max_draws)
    drawn = size
    while True:  # the question texts first (cheap), then the rows once, of the same items
        questions = rg.question_texts(spec, drawn, seed, "train", task_configs)
        kept = [index for index, question in enumerate(questions) if question not in banned]
        if len(kept) >= size or drawn >= limit:
            break
        drawn = min(limit, 2 * drawn)
    if len(kept) < size:
        count = distinct_questions(spec, task_configs)
        outside = len(set(questions) - banned)
        raise InputError(
            f"reasoning-gym task {spec!r} at {dict(task_configs or {})}: {drawn} items of its train stream (seed "
            f"{seed}) hold {len(kept)} rows outside the test set's {len(banned)} questions, of the {size} asked for "
            f"({outside} distinct questions outside it; the setting makes about {count.estimate}). Give a setting "
            "that makes more questions (task_configs), fewer rows or fewer test prompts"
        )
    rows = rg.reasoning_gym_dataset(
        spec,
        drawn,
        seed=seed,
        split="train",
        system_prompt=system_prompt,
        task_configs=task_configs,
        answer_format=answer_format,
    )
    return rows.select(kept[:size])
