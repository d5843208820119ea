"""What every training command shares: where it writes, and its trainer options with that place."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from trl_ext.options import field
from trl_ext.ppo.config import PPOConfig


@dataclass
class OutputOptions:
    out: str = field(help="output directory")
    overwrite: bool = field(False, help="write into an output directory that already holds other files")


def train_options(opts) -> PPOConfig:
    """The trainer's options of a command, with the command's output directory as its ``output_dir``."""
    return replace(opts.train, output_dir=opts.output.out)


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
