"""Saving and loading models the Hugging Face way, with errors that name the problem."""

from __future__ import annotations

import json
from pathlib import Path

from trl_ext.tasks.doubling import NUM_LABELS


class ArtifactError(ValueError):
    """A directory passed as a model is missing, not a model, or not the kind expected."""


def save_artifact(model, tokenizer, path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def _read_config(path: Path, what: str) -> dict:
    if not path.exists():
        raise ArtifactError(f"{what} directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise ArtifactError(f"{what} path {str(path)!r} is a file, not a model directory")
    config_file = path / "config.json"
    if not config_file.exists():
        raise ArtifactError(f"{what} directory {str(path)!r} holds no config.json: not a saved model")
    if not any(path.glob("*.safetensors")):
        raise ArtifactError(f"{what} directory {str(path)!r} holds no *.safetensors weights")
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{what} config {str(config_file)!r} is not valid JSON: {err}") from err


def _load_tokenizer(path: Path, what: str):
    from transformers import AutoTokenizer

    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise ArtifactError(f"{what} directory {str(path)!r} holds no tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    return tokenizer


def check_vocab(model, tokenizer, what: str) -> None:
    vocab = model.get_input_embeddings().num_embeddings
    if vocab < len(tokenizer):
        raise ArtifactError(f"{what} has {vocab} embeddings but its tokenizer has {len(tokenizer)} tokens")


def load_policy(path: str | Path):
    """Load ``(model, tokenizer)`` for a causal LM saved with ``save_artifact``."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    config = _read_config(path, "policy")
    if not any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in config.get("architectures") or []):
        raise ArtifactError(f"policy directory {str(path)!r} holds a {config.get('architectures')}, not a causal LM")
    tokenizer = _load_tokenizer(path, "policy")
    model = AutoModelForCausalLM.from_pretrained(path)
    check_vocab(model, tokenizer, f"policy {str(path)!r}")
    return model, tokenizer


def load_classifier(path: str | Path, num_labels: int | None = NUM_LABELS):
    """Load ``(model, tokenizer)`` for a sequence classifier; ``num_labels`` None accepts any."""
    from transformers import AutoModelForSequenceClassification

    path = Path(path)
    config = _read_config(path, "reward model")
    if not any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        raise ArtifactError(
            f"reward model directory {str(path)!r} holds a {config.get('architectures')}, not a sequence classifier"
        )
    tokenizer = _load_tokenizer(path, "reward model")
    model = AutoModelForSequenceClassification.from_pretrained(path)
    if num_labels is not None and model.config.num_labels != num_labels:
        raise ArtifactError(
            f"reward model {str(path)!r} has {model.config.num_labels} labels; the doubling reward needs {num_labels}"
        )
    check_vocab(model, tokenizer, f"reward model {str(path)!r}")
    return model, tokenizer
