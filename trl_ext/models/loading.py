"""The one loader of model folders: every command and the library's trainer take a policy, a reward model,
a critic's start or a base to train from a folder through it.

``check_model_dir`` runs before any weights load or anything is written: the folder exists and holds
config.json and safetensors weights (a GGUF file or a PEFT adapter in their place is named, with what to
do), its architecture fits the role, transformers reads its config, its label count is what the caller
needs, and its tokenizer loads with the pad/eos rule applied. Each failure is one ``ArtifactError`` naming
the role, the folder and what was found, which the CLI prints as one ``trl-ext: error:`` line.

The pad/eos rule (``pad_with_eos``), wherever a tokenizer is taken: no pad token -> the eos token pads; a
policy without an eos token is an error (a sampled response could never end), as is a classifier with
neither a pad nor an eos token.

peft's target-module mismatch becomes one line too, listing the linear modules that would fit:
``check_lora_targets`` from the config alone (before anything loads), ``peft_model`` where an adapter is
built. Only that peft error is translated; any other exception keeps its traceback.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trl_ext.errors import InputError
from trl_ext.models.directory import ArtifactError, describe_architecture, load_tokenizer, read_model_config

CAUSAL_LM = ("ForCausalLM", "LMHeadModel")
SEQUENCE_CLASSIFIER = ("ForSequenceClassification",)


@dataclass(frozen=True)
class Role:
    """What a folder passed in a role must hold."""

    holds: (
        str  # "causal LM", "sequence classifier" or "classifier base" (any model transformers can add a score head to)
    )
    generates: bool  # its tokenizer needs an eos token: a sampled response ends there
    padding_side: (
        str  # a policy's prompts pad on the left (generation continues them), a classifier's inputs on the right
    )
    tokenizer: bool = True  # whether the role reads the folder's tokenizer


ROLES = {
    "policy": Role("causal LM", True, "left"),
    "SFT base": Role("causal LM", True, "right"),
    "reward model": Role("sequence classifier", False, "right"),
    "critic_init": Role("sequence classifier", False, "right", tokenizer=False),  # the critic reads the policy's tokens
    "reward model base": Role("classifier base", False, "right"),
    "ref_model": Role("causal LM", False, "left", tokenizer=False),  # the reference scores the policy's tokens
}


def _role(role: str) -> Role:
    if role not in ROLES:
        raise KeyError(f"unknown model role {role!r}; one of {sorted(ROLES)}")  # a caller's bug, not the user's
    return ROLES[role]


def _require_fit(path: Path, config: dict, role: str) -> None:
    """The architecture config.json names fits the role, judged before anything is built."""
    holds, found = _role(role).holds, describe_architecture(config)
    if holds == "classifier base":
        from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

        if config.get("model_type") not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
            raise ArtifactError(
                f"{role} directory {str(path)!r} holds {found}, and transformers has no sequence "
                f"classifier for its model type {config.get('model_type')!r}"
            )
        return
    architectures = config.get("architectures") or []
    if any(a.endswith(CAUSAL_LM if holds == "causal LM" else SEQUENCE_CLASSIFIER) for a in architectures):
        return
    hint = ""
    if holds == "sequence classifier" and any(a.endswith(CAUSAL_LM) for a in architectures):
        hint = ": train a reward model from it first (`trl-ext train-reward-model --base DIR`, or rlhf's --preferences)"
    raise ArtifactError(f"{role} directory {str(path)!r} holds {found}, not a {holds}{hint}")


def _auto_config(path: Path, role: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as err:  # an unknown model type, a config this transformers cannot read
        import transformers

        reason = " ".join(str(err).split())
        raise ArtifactError(
            f"{role} directory {str(path)!r}: transformers {transformers.__version__} cannot read its "
            f"config.json: {reason[:300]}"
        ) from err


def pad_with_eos(tokenizer, role: str, where: str, error: type[Exception] = ArtifactError):
    """The pad/eos rule: no pad token -> eos pads; no eos is an error for a role that generates (and no pad
    and no eos for any role). ``where`` names the tokenizer's source in the message."""
    if _role(role).generates and tokenizer.eos_token_id is None:
        raise error(
            f"the {role} tokenizer {where} has no eos token: a response could never end; set "
            "tokenizer.eos_token (for a chat model, the token that ends its turn)"
        )
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise error(
                f"the {role} tokenizer {where} has no pad token and no eos token to pad with: set tokenizer.pad_token"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_model_dir(
    path: str | Path,
    role: str,
    *,
    labels: int | tuple[int, ...] | None = None,
    why: str | None = None,
    read_tokenizer: bool | None = None,
):
    """Every check a folder passed as ``role`` gets, without loading its weights; returns its tokenizer (pad/eos
    rule applied), or None when the role reads none or ``read_tokenizer`` is False. ``labels``: the label
    counts a classifier may have (``why``: what the caller needs them for)."""
    spec, path = _role(role), Path(path)
    _require_fit(path, read_model_config(path, role), role)
    config = _auto_config(path, role)
    if labels is not None:
        accepted = (labels,) if isinstance(labels, int) else tuple(labels)
        if config.num_labels not in accepted:
            raise ArtifactError(
                f"{role} directory {str(path)!r} has {config.num_labels} labels; "
                + (
                    why
                    or (
                        "expected a scalar reward model (num_labels=1)"
                        if accepted == (1,)
                        else f"expected num_labels in {accepted}"
                    )
                )
            )
    if not (spec.tokenizer if read_tokenizer is None else read_tokenizer):
        return None
    tokenizer = pad_with_eos(load_tokenizer(path, role, spec.padding_side), role, f"of {str(path)!r}")
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text_config, "vocab_size", None)
    if vocab is not None and vocab < len(tokenizer):  # ids past the embedding table would crash the first forward
        raise ArtifactError(
            f"{role} directory {str(path)!r} has {vocab} embeddings but its tokenizer has {len(tokenizer)} tokens"
        )
    return tokenizer


def load_policy(
    path: str | Path,
    dtype: str = "auto",
    *,
    role: str = "policy",
    tokenizer=None,
    error: type[Exception] = ArtifactError,
):
    """``(model, tokenizer)`` of the causal LM in ``path`` in ``dtype`` ('auto': the checkpoint's), checked first.
    A ``tokenizer`` given is used instead of the folder's, with the pad/eos rule (``error``: what that raises)."""
    from transformers import AutoModelForCausalLM

    from trl_ext.models.dtypes import torch_dtype

    if tokenizer is None:
        tokenizer = check_model_dir(path, role)
    else:
        check_model_dir(path, role, read_tokenizer=False)
        pad_with_eos(tokenizer, role, f"given with {str(path)!r}", error)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype)), tokenizer


def load_sequence_classifier(
    path: str | Path,
    role: str,
    dtype: str = "auto",
    *,
    labels: int | tuple[int, ...] | None = None,
    why: str | None = None,
    **load_kwargs,
):
    """``(model, tokenizer)`` of a sequence classifier folder (tokenizer None for a role that reads none),
    checked first. ``load_kwargs`` go to ``from_pretrained`` (a reward model base: ``num_labels=1``...)."""
    from transformers import AutoModelForSequenceClassification

    from trl_ext.models.dtypes import torch_dtype

    tokenizer = check_model_dir(path, role, labels=labels, why=why)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch_dtype(dtype), **load_kwargs)
    except (ValueError, KeyError) as err:
        if role != "reward model base":
            raise
        raise ArtifactError(
            f"reward model base {str(path)!r} cannot become a sequence classifier: {str(err).splitlines()[0]}"
        ) from err
    if tokenizer is not None and model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id  # decoder classifiers score the last non-pad token
    return model, tokenizer


# ---- LoRA targets ---------------------------------------------------------------------------------------------


def linear_module_names(model) -> list[str]:
    """Leaf names of the model's linear layers (``nn.Linear``, and GPT-2's ``Conv1D``), first seen first, the
    output head left out: the names LoRA's ``target_modules`` can take."""
    from torch import nn

    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        Conv1D = nn.Linear
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names: list[str] = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, (nn.Linear, Conv1D)) and module is not head and leaf not in names:
            names.append(leaf)
    return names


def lora_targets_message(model, targets, role: str = "policy", where: str = "") -> str:
    shown = targets if isinstance(targets, str) else ", ".join(sorted(targets))
    return (
        f"LoRA target modules {shown} match no module of the {role} ({type(model).__name__}{where}); its linear "
        f"modules: {', '.join(linear_module_names(model))} (or 'all-linear')"
    )


def _matches(target: str, names: list[str], regex: bool) -> bool:
    """peft's rule: a string target is a regex over the full module name; a list entry names a module or its suffix."""
    if regex:
        return any(re.fullmatch(target, n) for n in names)
    return any(n == target or n.endswith("." + target) for n in names)


def check_lora_targets(path: str | Path, target_modules, role: str = "policy") -> None:
    """Refuse LoRA targets that match no module of the causal LM in ``path``, from its config alone: the model
    is built on the meta device, no weights are read. Stricter than peft, which refuses only when none match:
    a name that matches nothing is a typo here."""
    if target_modules is None or target_modules == "all-linear":
        return
    import torch
    from transformers import AutoModelForCausalLM

    regex = isinstance(target_modules, str)
    if not regex and not target_modules:
        raise ArtifactError("no LoRA target modules given: name some (comma-separated) or give 'all-linear'")
    config = _auto_config(Path(path), role)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return  # an architecture that cannot be built without weights: peft_model still names a mismatch later
    names = [name for name, _ in model.named_modules()]
    unmatched = [t for t in ([target_modules] if regex else sorted(target_modules)) if not _matches(t, names, regex)]
    if unmatched:
        raise ArtifactError(lora_targets_message(model, unmatched, role, f" in {str(path)!r}"))


def _no_matching_targets(err: Exception) -> bool:
    """peft's "target modules not found" error (a NoMatchingPeftModuleError in recent peft, a ValueError in older)."""
    try:
        from peft.utils.error import NoMatchingPeftModuleError
    except ImportError:
        NoMatchingPeftModuleError = ()
    return isinstance(err, NoMatchingPeftModuleError) or (
        "Target modules" in str(err) and "not found in the base model" in str(err)
    )


@contextmanager
def lora_target_errors(model, peft_config, role: str = "policy"):
    """Around code that builds a PEFT model from ``model`` (ours, or a TRL trainer's constructor): peft's
    target-module mismatch becomes one ``ArtifactError`` listing the linear modules; anything else passes."""
    try:
        yield
    except ValueError as err:
        if peft_config is None or not _no_matching_targets(err):
            raise
        raise ArtifactError(lora_targets_message(model, peft_config.target_modules, role)) from err


def peft_model(model, peft_config, role: str = "policy"):
    """``peft.get_peft_model`` with ``lora_target_errors``."""
    import warnings

    from peft import PeftConfig, get_peft_model

    if not isinstance(peft_config, PeftConfig):  # TRL's trainers take a PeftConfig only
        raise InputError(
            f"peft_config must be a peft config (peft.LoraConfig(...)), got {type(peft_config).__name__}"
            + (": peft.LoraConfig(**peft_config)" if isinstance(peft_config, dict) else "")
        )
    with lora_target_errors(model, peft_config, role), warnings.catch_warnings():
        # peft (0.21) reads the model's `is_gradient_checkpointing`, which transformers 5.24 renamed and made
        # warn: a notice about peft's code, not the caller's. Only that one warning is silenced, only here.
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, peft_config)


# ---- prompts --------------------------------------------------------------------------------------------------


def truncation_notice(truncation, max_length: int) -> str | None:
    """The one line a run prints when prompts were cut to ``max_length`` tokens (``truncation``: what
    ``ppo.data.truncate_prompts`` reports: ``cut`` of ``total`` prompts, at most ``most`` tokens from one)."""
    if not truncation.cut:
        return None
    return (
        f"[prompts] {truncation.cut} of {truncation.total} prompts are longer than max_prompt_length "
        f"{max_length} and were cut on the left, by up to {truncation.most} tokens (the longest had "
        f"{max_length + truncation.most})"
    )
