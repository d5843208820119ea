"""Supervised fine-tuning before PPO (the first stage of seeds 002-004): TRL's ``SFTTrainer`` on
prompt/completion data (text or conversations, rendered with the chat template as TRL does), loss on the
completion only; TRL's language-modeling rows (``messages`` or ``text``) are accepted too, loss on all of it.

With a LoRA config the adapter is merged into the weights afterwards, so the result is a plain
causal LM: PPO then puts a fresh adapter on it, and the SFT model is PPO's reference.
"""

from __future__ import annotations

from trl_ext.data.jsonl import check_messages
from trl_ext.errors import InputError
from trl_ext.rewards.classifier import is_conversation


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
        raise SFTDataError(f"SFT data needs 'prompt' and 'completion' columns (or TRL's 'messages' or 'text'); it "
                           f"lacks {missing} (columns: {columns})")
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


def supervised_finetune(model, tokenizer, dataset, *, output_dir: str, steps: int, batch_size: int,
                        learning_rate: float, seed: int = 0, peft_config=None):
    """Run ``SFTTrainer`` for ``steps`` steps; returns ``(model, log history)`` with any LoRA adapter merged."""
    from transformers import PrinterCallback, ProgressCallback
    from trl import SFTConfig, SFTTrainer

    from trl_ext.models.activation_checkpointing import checkpointing_training_argument
    from trl_ext.models.loading import lora_target_errors
    from trl_ext.ppo.precision import launch_training_arguments

    if check_sft_rows(dataset) and not getattr(tokenizer, "chat_template", None):
        raise SFTDataError(f"the SFT rows are conversations, but the tokenizer {tokenizer.name_or_path!r} has no "
                           "chat template: give text rows or a tokenizer with one")
    args = SFTConfig(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
                     learning_rate=learning_rate, lr_scheduler_type="cosine", warmup_steps=0, seed=seed,
                     **launch_training_arguments(), report_to="none",
                     logging_steps=max(1, steps // 10), save_strategy="no", disable_tqdm=True,
                     **checkpointing_training_argument(False), max_length=None, dataset_num_proc=None)
    with lora_target_errors(model, peft_config, "SFT base"):  # SFTTrainer builds the adapter itself
        trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                             peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    tuned = trainer.model
    if hasattr(tuned, "merge_and_unload"):
        tuned = tuned.merge_and_unload()
    return tuned, trainer.state.log_history
