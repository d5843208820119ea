"""Saving and loading models the Hugging Face way, with errors that name the problem."""

from __future__ import annotations

from pathlib import Path

from trl_ext.models.directory import ArtifactError, load_tokenizer, read_model_config, require_architecture
from trl_ext.tasks.doubling.task import NUM_LABELS

__all__ = ["ArtifactError", "check_vocab", "load_classifier", "load_policy", "save_artifact"]


def save_artifact(model, tokenizer, path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def check_vocab(model, tokenizer, what: str) -> None:
    vocab = model.get_input_embeddings().num_embeddings
    if vocab < len(tokenizer):
        raise ArtifactError(f"{what} has {vocab} embeddings but its tokenizer has {len(tokenizer)} tokens")


def load_policy(path: str | Path):
    """Load ``(model, tokenizer)`` for a causal LM saved with ``save_artifact``."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    config = read_model_config(path, "policy")
    require_architecture(path, config, ("ForCausalLM", "LMHeadModel"), "policy", "causal LM")
    tokenizer = load_tokenizer(path, "policy")
    model = AutoModelForCausalLM.from_pretrained(path)
    check_vocab(model, tokenizer, f"policy {str(path)!r}")
    return model, tokenizer


def load_classifier(path: str | Path, num_labels: int | None = NUM_LABELS):
    """Load ``(model, tokenizer)`` for a sequence classifier; ``num_labels`` None accepts any."""
    from transformers import AutoModelForSequenceClassification

    path = Path(path)
    config = read_model_config(path, "reward model")
    require_architecture(path, config, ("ForSequenceClassification",), "reward model", "sequence classifier")
    tokenizer = load_tokenizer(path, "reward model")
    model = AutoModelForSequenceClassification.from_pretrained(path)
    if num_labels is not None and model.config.num_labels != num_labels:
        raise ArtifactError(
            f"reward model {str(path)!r} has {model.config.num_labels} labels; the doubling reward needs {num_labels}"
        )
    check_vocab(model, tokenizer, f"reward model {str(path)!r}")
    return model, tokenizer
