"""Turn a GGUF file (llama.cpp's format) into a checkpoint saved as hub checkpoints are.

transformers reads GGUF through the ``gguf`` package and dequantises it, but the model it returns still
carries a ``quantization_config`` naming the GGUF file, and the tokenizer's eos is whatever the GGUF's
metadata says. ``convert_gguf`` makes a plain checkpoint from it: bf16 (or the dtype asked for)
safetensors, the tokenizer with its chat template, and eos/pad/generation_config set by one rule:

* **eos** is the token the chat template ends an assistant turn with (found by rendering a two-turn
  conversation and reading the special token that follows the assistant's text: ``<|im_end|>`` for
  ChatML templates such as SmolLM2's, ``<|eot_id|>`` for Llama 3's). Generation must stop where the
  template closes a turn, whatever the GGUF calls eos. Without a chat template, or when no special
  token follows the assistant's text, the GGUF's own eos is kept.
* **pad** is the GGUF's padding token when it names one, else the eos.

``python -m trl_ext.models.gguf FILE.gguf --out DIR`` runs it. Needs the ``gguf`` package
(``pip install 'trl-ext[real-model]'``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from trl_ext.errors import InputError

DTYPES = ("bfloat16", "float16", "float32")
_SENTINEL = "TRLEXT-ASSISTANT-TEXT-7f3a"  # text no template rewrites, to find where the assistant turn ends


class GGUFError(InputError):
    """A GGUF file that cannot be converted; the message says why."""


def turn_end_token(tokenizer) -> str | None:
    """The special token the chat template writes right after an assistant's text, or ``None``."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # noqa: BLE001 - templates may refuse this conversation (e.g. require a system turn)
        return None
    if not isinstance(text, str) or _SENTINEL not in text:
        return None
    tail = text.split(_SENTINEL, 1)[1].lstrip()
    # Longest first, so that "<|im_end|>" wins over a shorter token that happens to prefix it.
    specials = sorted(set(tokenizer.get_added_vocab()) | set(tokenizer.all_special_tokens), key=len, reverse=True)
    return next((token for token in specials if token and tail.startswith(token)), None)


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "bfloat16") -> Path:
    """Convert ``gguf_path`` into a plain Hugging Face checkpoint in ``out_dir`` (created); returns it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise GGUFError(f"GGUF file {str(gguf_path)!r} does not exist")
    if dtype not in DTYPES:
        raise GGUFError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if importlib.util.find_spec("gguf") is None:
        raise GGUFError("reading GGUF needs the 'gguf' package: pip install 'trl-ext[real-model]'")

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    eos = turn_end_token(tokenizer) or tokenizer.eos_token
    if eos is None:
        raise GGUFError(f"{name}: the GGUF names no eos token and its chat template ends no turn with one")
    tokenizer.eos_token = eos
    if tokenizer.pad_token is None:
        tokenizer.pad_token = eos
    eos_id, pad_id = tokenizer.convert_tokens_to_ids(eos), tokenizer.pad_token_id

    # Dequantised in float32; the config still names the GGUF file as its "quantization".
    source = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = source.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.eos_token_id, config.pad_token_id = eos_id, pad_id
    config.bos_token_id = tokenizer.bos_token_id
    # A plain model: nothing in it remembers GGUF, so the saved checkpoint loads like any hub one.
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    missing, unexpected = model.load_state_dict(source.state_dict(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise GGUFError(
            f"{name}: weights do not match {type(model).__name__} (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    del source
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_id, pad_token_id=pad_id
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trl_ext.models.gguf", description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf_file", help="the .gguf file to convert")
    parser.add_argument("--out", required=True, help="directory to save the checkpoint in")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="dtype of the saved weights")
    args = parser.parse_args(argv)
    try:
        out = convert_gguf(args.gguf_file, args.out, dtype=args.dtype)
    except GGUFError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
