"""One training run as the commands run it, whatever trains it (``trl_ext.runners``): what it trains and scores
with, where it writes, and the point a resumed run goes on from."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from trl_ext.options import field
from trl_ext.ppo.config import PPOConfig


@dataclass
class ModelOptions:
    """The policy and what scores it (one reward: ``trl_ext.rewards.loading.reward_of``); each command's subclass
    says what its directories hold."""

    policy: str = field(help="directory of the policy")
    reward: str | None = field(None, help="directory of the reward model")
    reward_fn: str | None = field(None, help="your own reward function as 'module:callable' (TRL's reward_funcs "
                                  "convention); summed with --reward when both are given")
    reward_url: str | None = field(None, help="a reward server (`trl-ext serve-reward`) as the address it prints, "
                                   "e.g. http://127.0.0.1:8000; summed with --reward/--reward-fn when given")

    @property
    def has_reward(self) -> bool:
        return bool(self.reward or self.reward_fn or self.reward_url)


@dataclass
class OutputOptions:
    out: str = field(help="output directory")
    overwrite: bool = field(False, help="write into an output directory that already holds other files")


def train_options(opts) -> PPOConfig:
    """The trainer's options of a run, with the run's output directory as its ``output_dir``."""
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


def resumed_update(cfg: PPOConfig, out: str | Path) -> int | None:
    """The update a ``--resume-from-checkpoint`` run goes on after; None for a fresh run."""
    if not cfg.resume_from_checkpoint:
        return None
    from trl_ext.ppo import checkpoint

    return checkpoint.read_state(checkpoint.resolve(cfg.resume_from_checkpoint, out))["update"]
