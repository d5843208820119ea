"""Prompt datasets in TRL's standard formats, tokenized for the scratch trainer.

Accepted: a ``prompt`` column of text, or of conversations (lists of ``{"role", "content"}``
messages; the chat template is applied with ``add_generation_prompt=True``, as TRL's GRPO does),
or an already tokenized ``input_ids`` column. Other columns go to the reward functions.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from trl_ext.data.sequences import is_conversation
from trl_ext.errors import InputError


class DatasetError(InputError):
    """A prompt dataset row the trainer cannot use; the message names the row."""


def _tokenizer_name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


@contextmanager
def encoding_errors(
    tokenizer, where: str, text, what: str = "the prompt", fix: str = "give prompts its vocabulary covers"
):
    """Where ``text`` is encoded: a tokenizer that cannot encode it (a WordLevel vocabulary without an unknown token
    raises on any character outside it) is named with the row, not as the tokenizer's traceback."""
    try:
        yield
    except Exception as err:
        if type(err) is not Exception:  # the tokenizers library raises plain Exceptions; others keep their traceback
            raise
        cause = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DatasetError(
            f"{where}: the tokenizer {_tokenizer_name(tokenizer)!r} cannot encode {what} {text!r:.80} ({cause}); {fix}"
        ) from err


def prompt_ids(prompt, tokenizer, row: int | str) -> list[int]:
    """Token ids of one prompt (text or conversation); errors name the row (an index, or a 'file:line')."""
    where = f"row {row}" if isinstance(row, int) else row
    if is_conversation(prompt):
        if not has_chat_template(tokenizer):
            raise DatasetError(
                f"{where} is a conversation, but the tokenizer {_tokenizer_name(tokenizer)!r} has "
                "no chat template: set tokenizer.chat_template or give text prompts"
            )
        for message in prompt:
            if not isinstance(message.get("content"), str):
                raise DatasetError(f"{where}: message {message!r} has no text 'content'")
        with encoding_errors(tokenizer, where, prompt):
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
        ids = ids["input_ids"]
    elif isinstance(prompt, str):
        with encoding_errors(tokenizer, where, prompt):
            ids = tokenizer(text=prompt)["input_ids"]
    else:
        raise DatasetError(
            f"{where}: 'prompt' must be text or a list of {{'role', 'content'}} messages, "
            f"got {type(prompt).__name__} {prompt!r:.80}"
        )
    if not ids:
        raise DatasetError(f"{where}: the prompt {prompt!r:.80} tokenizes to nothing")
    return list(ids)


@dataclass(frozen=True)
class Truncation:
    """What ``truncate_prompts`` cut: ``cut`` of ``total`` prompts lost tokens, at most ``most`` from one."""

    cut: int
    total: int
    most: int


def truncate_prompts(ids: list[list[int]], max_length: int | None) -> tuple[list[list[int]], Truncation]:
    """Keep the last ``max_length`` tokens of every prompt (on the left, as TRL's GRPO cuts prompts: the
    generation prompt a chat template ends with survives); the one place prompts are cut."""
    if max_length is None:
        return [list(i) for i in ids], Truncation(0, len(ids), 0)
    if max_length <= 0:
        raise DatasetError(f"max_prompt_length must be positive, got {max_length}")
    over = [len(i) - max_length for i in ids if len(i) > max_length]
    return [list(i[-max_length:]) for i in ids], Truncation(len(over), len(ids), max(over, default=0))


# what to build a datasets.Dataset from, by what was given instead
AS_DATASET = {
    "list": "Dataset.from_list(rows)",
    "dict": "Dataset.from_dict(columns)",
    "DataFrame": "Dataset.from_pandas(frame)",
    "DatasetDict": "one of its splits, e.g. dataset['train']",
    "IterableDataset": "load it without streaming=True (the trainer reads batches in order and resumes by index)",
}


def check_is_dataset(dataset) -> None:
    from datasets import Dataset

    if not isinstance(dataset, Dataset):
        kind = type(dataset).__name__
        hint = AS_DATASET.get(kind, "build one with datasets.Dataset.from_list or from_dict")
        raise DatasetError(f"train_dataset must be a datasets.Dataset, not {kind}: {hint}")


def prepare_prompt_dataset(dataset, tokenizer, response_length: int = 0, positions: int | None = None):
    """Add ``input_ids`` to a ``prompt`` dataset (kept as is when present); check every row, and that the longest
    prompt and ``response_length`` fit the model's ``positions``."""
    check_is_dataset(dataset)
    dataset = _with_input_ids(dataset, tokenizer)
    longest = max(map(len, dataset["input_ids"]), default=0)
    check_context(longest, response_length, positions, "train_dataset")
    return dataset


def _with_input_ids(dataset, tokenizer):
    columns = dataset.column_names
    if "input_ids" in columns:
        empty = next((i for i, ids in enumerate(dataset["input_ids"]) if len(ids) == 0), None)
        if empty is not None:
            raise DatasetError(f"row {empty}: 'input_ids' is empty")
        return dataset
    if "prompt" not in columns:
        raise DatasetError(
            f"train_dataset needs a 'prompt' column (text or conversation) or 'input_ids'; it has {columns}"
        )
    prompts = dataset["prompt"]
    first_is_conversation = len(prompts) > 0 and is_conversation(prompts[0])
    mixed = next((i for i, p in enumerate(prompts) if is_conversation(p) != first_is_conversation), None)
    if mixed is not None:
        raise DatasetError(
            f"row {mixed}: prompts mix text and conversations (row 0 is "
            f"{'a conversation' if first_is_conversation else 'text'}); use one format"
        )
    return dataset.add_column("input_ids", [prompt_ids(p, tokenizer, i) for i, p in enumerate(prompts)])


def max_positions(model) -> int | None:
    """The positions a model was built for (GPT-2's ``n_positions`` is read by this name too); None: no limit."""
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


def check_context(prompt_length: int, response_length: int, positions: int | None, where: str) -> None:
    """A prompt and its whole response must fit the model's positions: past them a learned position table (GPT-2)
    fails with an IndexError inside a forward pass, and a rotary model runs where it never trained."""
    if positions is not None and prompt_length + response_length > positions:
        raise DatasetError(
            f"{where}: a prompt of {prompt_length} tokens and response_length {response_length} need "
            f"{prompt_length + response_length} positions, and the model has {positions}: shorten the prompts "
            "(--max-prompt-length) or lower response_length"
        )
