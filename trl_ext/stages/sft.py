"""Supervised fine-tuning before PPO: TRL's ``SFTTrainer`` on
prompt/completion data (text or conversations, rendered with the chat template as TRL does), loss on the
completion only; TRL's language-modeling rows (``messages`` or ``text``) are accepted too, loss on all of it.

With a LoRA config the adapter is merged into the weights afterwards, so the result is a plain
causal LM: PPO then puts a fresh adapter on it, and the SFT model is PPO's reference.
"""

from __future__ import annotations

from pathlib import Path

from trl_ext.data.jsonl import check_messages
from trl_ext.data.sequences import is_conversation
from trl_ext.errors import InputError


class SFTDataError(InputError):
    """A prompt/completion row the trainer cannot use; the message names the row."""


def check_sft_rows(dataset) -> bool:
    """Every row has a non-empty ``prompt`` and ``completion`` of one format (or, TRL's language-modeling
    formats, a ``messages`` conversation or a ``text``); returns whether they are conversations."""
    columns = dataset.column_names
    keys = ("prompt", "completion")
    if not all(c in columns for c in keys):
        keys = next(((k,) for k in ("messages", "text") if k in columns), None)
    if keys is None:
        missing = [c for c in ("prompt", "completion") if c not in columns]
        raise SFTDataError(
            f"SFT data needs 'prompt' and 'completion' columns (or TRL's 'messages' or 'text'); it "
            f"lacks {missing} (columns: {columns})"
        )
    formats = set()
    for row, example in enumerate(dataset):
        for key in keys:
            value = example[key]
            if not value or (isinstance(value, str) and not value.strip()):
                raise SFTDataError(f"row {row}: {key!r} is missing or empty")
            check_messages(value, f"row {row}", key, SFTDataError)
            formats.add(is_conversation(value))
        if len(formats) > 1:
            raise SFTDataError(f"row {row}: mixes text and conversations; use one format for every row")
    return formats.pop()


def stage_training_arguments(
    output_dir: str, steps: int, batch_size: int, learning_rate: float, seed: int, *, warmup_steps: int = 0
) -> dict:
    """The keywords a stage's TRL trainer config takes (``SFTConfig`` here, ``RewardConfig`` in ``reward_model``):
    ``steps`` steps on a cosine schedule, the launch's precision, a log entry every tenth of the steps, nothing
    saved, reported or shown as a progress bar, no activation checkpointing, no length cap."""
    from trl_ext.models.activation_checkpointing import checkpointing_training_argument
    from trl_ext.ppo.precision import launch_training_arguments

    return dict(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=warmup_steps,
        seed=seed,
        **launch_training_arguments(),
        report_to="none",
        logging_steps=max(1, steps // 10),
        save_strategy="no",
        disable_tqdm=True,
        **checkpointing_training_argument(False),
        max_length=None,
    )


def train_quietly(trainer) -> None:
    """``trainer.train()`` without the callbacks that print the logs and draw a progress bar."""
    from transformers import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()


def loss_ends(history: list[dict]) -> dict:
    """The first and the last training loss of a TRL trainer's log history (None where it logged none)."""
    losses = [h["loss"] for h in history if "loss" in h]
    return {"first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None}


def check_sft_format(conversational: bool, tokenizer) -> None:
    """Conversations need a chat template: SFTTrainer renders them with the policy's own (``--tool-template`` is
    PPO's, not this stage's)."""
    if conversational and not getattr(tokenizer, "chat_template", None):
        raise SFTDataError(
            f"the SFT rows are conversations, but the tokenizer {tokenizer.name_or_path!r} has no "
            "chat template: give text rows or a tokenizer with one"
        )


def supervised_finetune(
    model,
    tokenizer,
    dataset,
    *,
    output_dir: str,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int = 0,
    peft_config=None,
):
    """Run ``SFTTrainer`` for ``steps`` steps; returns ``(model, log history)`` with any LoRA adapter merged."""
    from trl import SFTConfig, SFTTrainer

    from trl_ext.models.loading import lora_target_errors

    check_sft_format(check_sft_rows(dataset), tokenizer)
    args = SFTConfig(
        **stage_training_arguments(output_dir, steps, batch_size, learning_rate, seed), dataset_num_proc=None
    )
    with lora_target_errors(model, peft_config, "SFT base"):  # SFTTrainer builds the adapter itself
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config
        )
    train_quietly(trainer)
    tuned = trainer.model
    if hasattr(tuned, "merge_and_unload"):
        tuned = tuned.merge_and_unload()
    return tuned, trainer.state.log_history


def sft_stage(
    policy: str,
    data: str,
    folder: str | Path,
    *,
    steps: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    peft_config=None,
    record: dict | None = None,
    say=print,
) -> str:
    """``policy`` fine-tuned on the prompt/completion ``data`` file into ``folder``, or the model already there
    when nothing it ran with changed (``stages.reuse``; ``record``: more of what it ran with, the LoRA options)."""
    from trl_ext.data.jsonl import as_dataset, read_jsonl
    from trl_ext.stages.reuse import fingerprint, reuse_or_run

    if not Path(data).is_file():
        raise FileNotFoundError(f"SFT data file {data!r} does not exist")
    config = {
        "policy": policy,
        "data": data,
        "steps": steps,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "seed": seed,
        **(record or {}),
        "inputs": fingerprint(data, policy),
    }

    def run() -> dict:
        from trl_ext.models.loading import load_policy

        rows = read_jsonl(data, "SFT data")  # supervised_finetune checks every row
        say(f"[sft] fine-tuning {policy} on {data} ...")
        base, tokenizer = load_policy(policy, role="SFT base")
        model, history = supervised_finetune(
            base,
            tokenizer,
            as_dataset(rows),
            output_dir=str(folder),
            steps=steps,
            batch_size=batch_size,
            learning_rate=learning_rate,
            seed=seed,
            peft_config=peft_config,
        )
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        return {"stage": "sft", **loss_ends(history)}

    reuse_or_run("sft", folder, config, run, say)
    return str(folder)
