"""Checks on a directory passed as a saved Hugging Face model, with errors that name what is wrong."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from trl_ext.errors import InputError


class ArtifactError(InputError):
    """A directory passed as a model is missing, not a model, or not the kind expected."""


# The converter another module provides: llama.cpp's files become a checkpoint trl-ext reads.
GGUF_CONVERT = "python -m trl_ext.models.gguf {file} --out DIR"


def _convert_gguf(gguf: Path) -> str:
    return (
        f"trl-ext reads Hugging Face checkpoints; convert it with `{GGUF_CONVERT.format(file=gguf)}` "
        "(a bf16 safetensors checkpoint) and pass DIR"
    )


def _not_a_checkpoint(what: str, path: Path) -> str:
    """Why a directory without config.json is no model, naming what it holds instead when that is telling."""
    gguf = sorted(path.glob("*.gguf"))
    if gguf:
        return (
            f"{what} directory {str(path)!r} holds a GGUF file ({gguf[0].name}) and no config.json: "
            + _convert_gguf(gguf[0])
        )
    adapter = path / "adapter_config.json"
    if adapter.exists():  # a LoRA run's output (rlhf writes one) given where a whole model is expected
        try:
            base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        except (json.JSONDecodeError, AttributeError):
            base = None
        return (
            f"{what} directory {str(path)!r} holds a PEFT adapter (adapter_config.json, base {base!r}) and no "
            "config.json: pass its base model, or merge the adapter into it (peft's merge_and_unload) and save that"
        )
    return f"{what} directory {str(path)!r} holds no config.json: not a saved model"


def read_model_config(path: str | Path, what: str) -> dict:
    """The ``config.json`` of a saved model directory (safetensors weights required)."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{what} directory {str(path)!r} does not exist")
    if not path.is_dir():
        if path.suffix == ".gguf":
            raise ArtifactError(
                f"{what} path {str(path)!r} is a GGUF file, not a model directory: " + _convert_gguf(path)
            )
        raise ArtifactError(f"{what} path {str(path)!r} is a file, not a model directory")
    config_file = path / "config.json"
    if not config_file.exists():
        raise ArtifactError(_not_a_checkpoint(what, path))
    if not any(path.glob("*.safetensors")):
        pickled = sorted(p.name for p in path.glob("*.bin"))
        raise ArtifactError(
            f"{what} directory {str(path)!r} holds no *.safetensors weights"
            + (
                f" ({pickled[0]} is a pickle, which trl-ext does not load: save the model again with save_pretrained)"
                if pickled
                else ""
            )
        )
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{what} config {str(config_file)!r} is not valid JSON: {err}") from err


# What a class name says a checkpoint is, by its suffix (the first that matches).
_KINDS = (
    ("ForCausalLM", "causal LM"),
    ("LMHeadModel", "causal LM"),
    ("ForSequenceClassification", "sequence classifier"),
    ("ForMaskedLM", "masked LM"),
    ("ForTokenClassification", "token classifier"),
    ("ForQuestionAnswering", "question-answering model"),
    ("ForConditionalGeneration", "generation model"),
    ("Model", "bare model without a task head"),
)


def describe_architecture(config: dict) -> str:
    """What a config.json says its folder holds: 'a causal LM (LlamaForCausalLM)'."""
    architectures = config.get("architectures") or []
    if not architectures:
        return f"a model of unknown kind (no 'architectures' in config.json, model type {config.get('model_type')!r})"
    name = architectures[0]
    return f"a {next((kind for suffix, kind in _KINDS if name.endswith(suffix)), 'model')} ({name})"


def require_architecture(path: str | Path, config: dict, suffixes: tuple[str, ...], what: str, kind: str) -> None:
    """Raise unless one of the saved ``architectures`` ends with one of ``suffixes``."""
    architectures = config.get("architectures") or []
    if not any(a.endswith(suffixes) for a in architectures):
        raise ArtifactError(f"{what} directory {str(path)!r} holds {describe_architecture(config)}, not a {kind}")


def load_tokenizer(path: str | Path, what: str, padding_side: str = "left"):
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise ArtifactError(f"{what} directory {str(path)!r} holds no tokenizer")
    if (
        not (path / "tokenizer.json").exists()
        and (path / "tokenizer.model").exists()
        and importlib.util.find_spec("sentencepiece") is None
    ):  # transformers would fall back to tiktoken, and fail
        raise ArtifactError(
            f"{what} directory {str(path)!r}: its tokenizer cannot be loaded: it has a sentencepiece "
            "tokenizer.model and no tokenizer.json; pip install sentencepiece, or save the tokenizer "
            "with one (tokenizer.save_pretrained writes tokenizer.json)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (ValueError, OSError, ImportError) as err:  # what transformers raises on the folder's tokenizer files
        raise ArtifactError(
            f"{what} directory {str(path)!r}: its tokenizer cannot be loaded: {_tokenizer_failure(err)}"
        ) from err
    tokenizer.padding_side = padding_side
    return tokenizer


def _tokenizer_failure(err: Exception) -> str:
    """transformers' reason in one line (its message spans several)."""
    text = " ".join(str(err).split())
    if "Couldn't instantiate the backend tokenizer" in text:  # no tokenizer.json, and no converter installed
        return (
            "no tokenizer.json, and its slow tokenizer files cannot be converted without sentencepiece or "
            "tiktoken (pip install sentencepiece tiktoken, or save the tokenizer as tokenizer.json)"
        )
    return text if len(text) <= 300 else text[:297] + "..."
