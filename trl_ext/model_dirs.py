"""Checks on a directory passed as a saved Hugging Face model, with errors that name what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

from trl_ext.errors import InputError


class ArtifactError(InputError):
    """A directory passed as a model is missing, not a model, or not the kind expected."""


def read_model_config(path: str | Path, what: str) -> dict:
    """The ``config.json`` of a saved model directory (safetensors weights required)."""
    path = Path(path)
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


def require_architecture(path: str | Path, config: dict, suffixes: tuple[str, ...], what: str, kind: str) -> None:
    """Raise unless one of the saved ``architectures`` ends with one of ``suffixes``."""
    architectures = config.get("architectures") or []
    if not any(a.endswith(suffixes) for a in architectures):
        raise ArtifactError(f"{what} directory {str(path)!r} holds a {architectures or 'model of unknown kind'}, "
                            f"not a {kind}")


def load_tokenizer(path: str | Path, what: str, padding_side: str = "left"):
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise ArtifactError(f"{what} directory {str(path)!r} holds no tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = padding_side
    return tokenizer
