"""Prompt files for PPO (``rlhf --prompts``) in TRL's two dataset formats, tokenized through the library's
one prompt path (``ppo.data.prompt_ids``); every error names the file and the line.

* ``.jsonl``, an object a line: standard (``{"prompt": "text"}``) or conversational (``{"prompt": [{"role":
  "user", "content": "..."}]}``), one format per file; other fields are columns the reward functions get.
* any other file: a plain-text prompt a line.

Conversations are rendered with the tokenizer's chat template and its generation prompt, as TRL's GRPO
renders them. Text prompts follow ``chat_template``: ``always`` wraps each as one user turn, ``never`` uses
it as it is, ``auto`` wraps it when the tokenizer has a chat template (an instruct model answers its own
format: given the raw text, SmolLM2-135M-Instruct ends its answer at once). A wrapped prompt is a
conversation from then on: reward functions get it, and conversational completions, as GRPO hands them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trl_ext.data.jsonl import check_messages, read_jsonl
from trl_ext.data.prompt_dataset import Truncation, has_chat_template, prompt_ids, truncate_prompts
from trl_ext.errors import InputError

CHAT_TEMPLATE_MODES = ("auto", "always", "never")
# Filled in by the trainers, or keywords reward functions are called with: a file's field of that name would clash.
RESERVED_FIELDS = (
    "input_ids",
    "attention_mask",
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_metric",
    "log_extra",
)
KINDS = {"conversational": "conversations", "standard": "standard text rows", "plain": "plain-text lines"}


@dataclass
class PromptFile:
    """A prompt file as written: the prompts (text or conversations), their line numbers, the other fields."""

    path: str
    lines: list[int]
    prompts: list
    columns: dict[str, list]
    kind: str  # "conversational", "standard" (.jsonl text) or "plain" (a text file's lines)

    @property
    def conversational(self) -> bool:
        return self.kind == "conversational"

    def where(self, index: int) -> str:
        return f"{self.path}:{self.lines[index]}"


def _check_prompt(value, where: str) -> bool:
    """Whether ``value`` is a conversation; refuses anything that is neither non-empty text nor messages."""
    if isinstance(value, str) and value.strip():
        return False
    if isinstance(value, list) and value:
        check_messages(value, where, "prompt")
        return True
    raise InputError(
        f'{where}: expected \'prompt\' as non-empty text or a list of {{"role", "content"}} messages, got {value!r:.80}'
    )


def read_prompt_file(path: str | Path) -> PromptFile:
    """Read and check a prompt file (no tokenizer needed): one format, every row usable."""
    path = Path(path)
    if path.suffix != ".jsonl":
        if not path.is_file():
            raise FileNotFoundError(f"prompts file {str(path)!r} does not exist")
        numbered = [
            (n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1) if line.strip()
        ]
        if not numbered:
            raise InputError(f"prompts file {str(path)!r} holds no prompts")
        return PromptFile(str(path), [n for n, _ in numbered], [line for _, line in numbered], {}, "plain")
    rows = read_jsonl(path, "prompts")
    first_line, first_conversational = None, None
    for number, row in rows:
        conversational = _check_prompt(row.get("prompt"), f"{path}:{number}")
        if first_line is None:
            first_line, first_conversational = number, conversational
        elif conversational != first_conversational:
            raise InputError(
                f"{path}:{number}: mixes text and conversations (line {first_line} is "
                f"{'a conversation' if first_conversational else 'text'}); use one format for every row"
            )
        reserved = next((k for k in row if k in RESERVED_FIELDS), None)
        if reserved:
            raise InputError(
                f"{path}:{number}: the field {reserved!r} is reserved (the trainer fills it in); rename it"
            )
    names = sorted(set().union(*(row for _, row in rows)) - {"prompt"})
    return PromptFile(
        str(path),
        [n for n, _ in rows],
        [row["prompt"] for _, row in rows],
        {name: [row.get(name) for _, row in rows] for name in names},
        "conversational" if first_conversational else "standard",
    )


def uses_chat_template(prompts: PromptFile, tokenizer, chat_template: str = "auto") -> bool:
    """Whether the prompts reach the policy through its chat template; refuses what cannot work."""
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise InputError(f"chat_template must be one of {', '.join(CHAT_TEMPLATE_MODES)}; got {chat_template!r}")
    has_template = has_chat_template(tokenizer)
    name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    if prompts.conversational:
        if chat_template == "never":
            raise InputError(
                f"{prompts.path}: the prompts are conversations, which only a chat template turns into "
                "text; chat_template 'never' is for text prompts"
            )
        if not has_template:
            raise InputError(
                f"{prompts.where(0)}: a conversation, but the tokenizer {name!r} has no chat template: "
                'give text prompts (a .txt file or {"prompt": "text"} rows) or a chat model'
            )
        return True
    if chat_template == "always" and not has_template:
        raise InputError(
            f"chat_template 'always', but the tokenizer {name!r} has no chat template to wrap "
            f"the prompts of {prompts.path} in; use 'auto' or 'never'"
        )
    return chat_template == "always" or (chat_template == "auto" and has_template)


def shown_prompts(prompts: PromptFile, templated: bool) -> list:
    """The prompts as the policy is given them: text, or conversations (text wrapped as a user turn when
    templated)."""
    if templated and not prompts.conversational:
        return [[{"role": "user", "content": text}] for text in prompts.prompts]
    return prompts.prompts


def check_encodable(prompts: PromptFile, tokenizer, templated: bool) -> None:
    """Tokenize every prompt as ``prepare_prompts`` will, to refuse one the tokenizer cannot encode before any stage
    trains (``prompt_ids`` names its line)."""
    for i, prompt in enumerate(shown_prompts(prompts, templated)):
        prompt_ids(prompt, tokenizer, prompts.where(i))


def describe(prompts: PromptFile, templated: bool, chat_template: str) -> str:
    """One line for the run's log: how many prompts, their format, whether the chat template is applied."""
    head = f"[prompts] {len(prompts.prompts)} {KINDS[prompts.kind]} from {prompts.path}"
    if prompts.conversational:
        return f"{head}, rendered with the policy's chat template (generation prompt added)"
    why = "" if chat_template != "auto" else (" (the tokenizer has one)" if templated else " (the tokenizer has none)")
    if templated:
        return f"{head}, wrapped as user turns and rendered with the chat template: chat_template {chat_template}{why}"
    return f"{head}, used as they are, no chat template: chat_template {chat_template}{why}"


@dataclass
class PreparedPrompts:
    """The PPO dataset (``prompt`` as the reward functions see it, ``input_ids`` as the policy does, the
    file's other fields) and what was done to get it."""

    dataset: object
    source: PromptFile
    templated: bool
    truncation: Truncation
    summary: str


def prepare_prompts(
    prompts: PromptFile | str | Path, tokenizer, chat_template: str = "auto", max_length: int | None = None
) -> PreparedPrompts:
    """Tokenize a prompt file for PPO: conversations (or wrapped text) through the chat template, text as it
    is, then cut on the left to ``max_length`` tokens (``truncation`` says how many were cut)."""
    from datasets import Dataset

    if not isinstance(prompts, PromptFile):
        prompts = read_prompt_file(prompts)
    templated = uses_chat_template(prompts, tokenizer, chat_template)
    shown = shown_prompts(prompts, templated)
    ids = [prompt_ids(p, tokenizer, prompts.where(i)) for i, p in enumerate(shown)]
    ids, truncation = truncate_prompts(ids, max_length)
    try:
        dataset = Dataset.from_dict({"prompt": shown, **prompts.columns, "input_ids": ids})
    except Exception as err:  # pyarrow refuses a field whose values differ in type from row to row
        raise InputError(
            f"{prompts.path}: a field's values cannot form one column ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); give each field one type"
        ) from err
    return PreparedPrompts(dataset, prompts, templated, truncation, describe(prompts, templated, chat_template))
