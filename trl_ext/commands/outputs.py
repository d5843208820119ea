"""What every training command shares: its trainer options, and an output directory it may write to."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from trl_ext.ppo.config import PPOConfig


def trainer_config(cfg) -> PPOConfig:
    """The trainer's options out of a command's config; the command's ``out`` becomes ``output_dir``."""
    names = PPOConfig.__dataclass_fields__
    options = {k: v for k, v in asdict(cfg).items() if k in names}
    options["output_dir"] = getattr(cfg, "out", None)
    return PPOConfig(**options)


def prepare_out_dir(path: str | Path, overwrite: bool, owned: tuple[str, ...] = ()) -> Path:
    """Refuse a directory that holds anything but our own outputs unless ``overwrite``; never delete."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"output path {str(path)!r} is a file")
    if path.exists() and not overwrite:
        foreign = sorted(p.name for p in path.iterdir() if p.name not in owned)
        if foreign:
            raise FileExistsError(f"output directory {str(path)!r} already holds {foreign[:5]}: "
                                  "pass --overwrite to write into it")
    path.mkdir(parents=True, exist_ok=True)
    return path
