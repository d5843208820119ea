"""Issue 80 item 4: a test prompt is never a training prompt. At easy settings a reasoning-gym task makes a few hundred
questions, so a train stream repeats its test stream's questions although no generator seed is shared;
trl_ext.data.reasoning_gym_splits estimates the setting's distinct questions, builds train streams without the test
questions (or refuses) and counts the overlap that runs record."""

import pytest

from trl_ext.data.reasoning_gym import loads_exact, reasoning_gym_dataset
from trl_ext.data.reasoning_gym_splits import distinct_questions, prompt_questions, question_overlap, train_excluding
from trl_ext.errors import InputError

pytest.importorskip("reasoning_gym")

TASK = "chain_sum"
EASY = {TASK: {"min_terms": 2, "max_terms": 2, "max_digits": 1}}  # benchmarks/public_tasks.py's easy chain_sum
TINY = {TASK: {"min_terms": 1, "max_terms": 1, "max_digits": 1}}  # "7 =": ten questions
TRAIN_SEED = 11 * 100_000  # a public-tasks PPO row's train stream (seed 11), beside its 64 test prompts of seed 0


def enumerated(terms: int) -> set[str]:
    """Every question chain_sum makes with ``terms`` one-digit terms (0-9, joined by + or -), written out."""
    expressions = [str(a) for a in range(10)]
    for _ in range(terms - 1):
        expressions = [f"{e} {op} {b}" for e in expressions for op in "+-" for b in range(10)]
    return {f"State the final answer to the following arithmetic problem: {e} =" for e in expressions}


def test_an_easy_train_stream_repeats_test_questions_and_the_excluding_one_holds_none():
    test = reasoning_gym_dataset(TASK, 64, seed=0, split="test", task_configs=EASY)
    raw = reasoning_gym_dataset(TASK, 320, seed=TRAIN_SEED, task_configs=EASY)
    assert question_overlap(raw, test) >= 20  # measured: 50 of the 64 test prompts are training prompts too

    train = train_excluding(TASK, 320, test, seed=TRAIN_SEED, task_configs=EASY)
    assert len(train) == 320 and question_overlap(train, test) == 0
    # the same stream, the test questions skipped: the raw rows that remain come first, in order, and the rest are
    # the stream's next items
    banned = set(prompt_questions(test))
    kept = [entry for entry, q in zip(raw["entry"], prompt_questions(raw)) if q not in banned]
    assert train["entry"][: len(kept)] == kept
    further = reasoning_gym_dataset(TASK, 1000, seed=TRAIN_SEED, task_configs=EASY)
    assert set(train["entry"]) <= set(further["entry"]) and train.column_names == raw.column_names
    # nothing to exclude: the plain stream
    assert train_excluding(TASK, 50, {"prompt": []}, seed=TRAIN_SEED, task_configs=EASY)["entry"] == raw["entry"][:50]


def test_the_overlap_counts_test_rows_by_their_question_text():
    system = {"role": "system", "content": "Answer."}
    train = {"prompt": [[system, {"role": "user", "content": "1 + 1 ="}], "2 + 2 ="]}
    test = {
        "prompt": [
            [{"role": "user", "content": "1 + 1 ="}],  # another system prompt (none): the same question
            [{"role": "system", "content": "Think."}, {"role": "user", "content": "1 + 1 ="}],  # counted again
            "2 + 2 =",  # a text prompt is its own question
            [system, {"role": "user", "content": "3 + 3 ="}],
        ]
    }
    assert question_overlap(train, test) == 3 and question_overlap(test, train) == 2


def test_the_distinct_count_matches_a_setting_small_enough_to_write_out():
    for terms, configs in ((1, TINY), (2, EASY)):
        every = enumerated(terms)
        count = distinct_questions(TASK, configs)
        # the written-out set is the setting's: a long stream asks those questions and no other
        assert set(prompt_questions(reasoning_gym_dataset(TASK, 4000, seed=9, task_configs=configs))) == every
        assert count.saturated and count.estimate == count.seen == len(every) and count.draws <= 4096
    wide = distinct_questions(TASK, {TASK: {"min_terms": 4, "max_terms": 4, "max_digits": 3}}, draws=1024)
    assert wide.draws == 1024 and not wide.saturated and wide.estimate > 10 * wide.draws  # "far more than drawn"


def test_a_setting_too_small_for_its_test_set_is_refused_with_the_counts():
    test = reasoning_gym_dataset(TASK, 64, seed=0, split="test", task_configs=TINY)
    assert len(set(prompt_questions(test))) == 10  # 64 test prompts ask every one of the ten questions
    with pytest.raises(
        InputError,
        match=r"'chain_sum'.*80 items .* hold 0 rows outside the test set's 10 questions, "
        r"of the 8 asked for .*makes about 10\)",
    ):
        train_excluding(TASK, 8, test, seed=TRAIN_SEED, task_configs=TINY)
    # nine of the ten questions held out: the tenth fills the stream, if the draws may run long enough
    nine = {"prompt": [q for q in prompt_questions(test) if not q.endswith(" 7 =")]}
    with pytest.raises(InputError, match="hold [0-9] rows outside"):
        train_excluding(TASK, 30, nine, seed=TRAIN_SEED, task_configs=TINY, max_draws=60)
    rows = train_excluding(TASK, 30, nine, seed=TRAIN_SEED, task_configs=TINY, max_draws=1000)
    assert {loads_exact(e)["answer"] for e in rows["entry"]} == {"7"}
