"""One training run as the commands run it, whatever trains it (``trl_ext.runs.runners``): what it trains and scores
with, where it writes, the point a resumed run goes on from, and the sequence ``ppo`` and ``rlhf`` share
(``run_training``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trl_ext.errors import InputError
from trl_ext.ppo.config import PPOConfig
from trl_ext.settings.fields import field


@dataclass
class ModelOptions:
    """The policy and what scores it (one reward: ``trl_ext.rewards.loading.reward_of``); each command's subclass
    says what its directories hold."""

    policy: str = field(help="directory of the policy")
    reward: str | None = field(None, help="directory of the reward model")
    reward_fn: str | None = field(
        None,
        help="your own reward function as 'module:callable' (TRL's reward_funcs "
        "convention); summed with --reward when both are given",
    )
    reward_url: str | None = field(
        None,
        help="a reward server (`trl-ext serve-reward`) as the address it prints, "
        "e.g. http://127.0.0.1:8000; summed with --reward/--reward-fn when given",
    )

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
    """``check_out_dir``, then the directory made."""
    path = check_out_dir(path, overwrite, owned)
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_out_dir(path: str | Path, overwrite: bool, owned: tuple[str, ...] = ()) -> Path:
    """Refuse a file, or a directory that holds anything but our own outputs unless ``overwrite``; never delete."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"output path {str(path)!r} is a file")
    if path.exists() and not overwrite:
        foreign = sorted(p.name for p in path.iterdir() if p.name not in owned)
        if foreign:
            raise FileExistsError(
                f"output directory {str(path)!r} already holds {foreign[:5]}: pass --overwrite to write into it"
            )
    return path


def resumed_update(cfg: PPOConfig, out: str | Path) -> int | None:
    """The update a ``--resume-from-checkpoint`` run goes on after; None for a fresh run."""
    if not cfg.resume_from_checkpoint:
        return None
    from trl_ext.ppo import checkpoint

    return checkpoint.read_state(checkpoint.resolve(cfg.resume_from_checkpoint, out))["update"]


@dataclass(frozen=True)
class RunSpec:
    """One training run as a command asks for it."""

    backend: str  # as the user named it: the progress lines and summary.json say it
    runner: str  # what trains: a key of trl_ext.runs.runners.RUNNERS
    config: PPOConfig  # the trainer's, its output_dir the run's folder
    record: dict  # what summary.json knows the run by (compare reuses a run whose record is the same)
    sources: dict  # where each option's value came from (trl_ext.settings.layers), for summary.json
    overwrite: bool = False  # write into a folder that holds other files
    owned: tuple[str, ...] = ()  # what the folder may already hold without --overwrite
    probe: Callable[[Any, Any], dict] | None = None  # (policy, tokenizer) -> {metric: value}, the task's probe
    probe_every: int = 0
    stop_at_target: bool = False  # stop once the probe's exact-match reaches 0.99


class Run:
    """A run under way, as its ``load`` step sees it: the processes, the folder, the update a resume goes on from."""

    def __init__(self, spec: RunSpec):
        import torch
        from accelerate import PartialState

        self.spec, self.out = spec, Path(spec.config.output_dir)
        # cpu=True when there is no GPU: under a multi-process launch that makes the ranks join over gloo
        # instead of each silently running alone.
        self.state = PartialState(cpu=not torch.cuda.is_available())
        self.resume_after = resumed_update(spec.config, self.out)

    @property
    def is_main(self) -> bool:
        return self.state.is_main_process

    def open_out(self, on_main: Callable[[], None] | None = None) -> None:
        """The folder prepared on the main process (a resumed run writes on into its own), then ``on_main`` there
        (stages whose output the others read); the other processes wait for both."""
        if self.is_main:
            prepare_out_dir(self.out, self.spec.overwrite or self.resume_after is not None, self.spec.owned)
            if on_main is not None:
                on_main()
        self.state.wait_for_everyone()


def run_training(
    spec: RunSpec, load: Callable[[Run], Any], summarize: Callable[[Any, Any, Any], dict], print_fn=print
) -> dict:
    """The run sequence ``ppo`` and ``rlhf`` share; returns the summary, also written to ``summary.json``.

    1. The runner can run here (TRL's PPO installed where it needs it, a resume only where it can); the processes;
       the update a resume goes on from.
    2. ``load(run)`` checks and loads the command's inputs and returns the ``RunInputs``; it calls ``run.open_out()``
       once nothing it checks can fail any more, so that a refused run writes nothing.
    3. A recorder (``metrics.jsonl``, the probes), the runner built, trained and its policy saved.
    4. ``summarize(inputs, runner, recorder)``: the command's own fields (every process calls it); with the
       backend, the record, the options' sources and the common fields, they go to ``summary.json`` on the main
       process.
    """
    from trl_ext.ppo.config import num_updates
    from trl_ext.runs.recorder import RunRecorder
    from trl_ext.runs.runners import check_runnable, fixed_differences, train_and_save, trl_trainer

    check_runnable(spec.runner, spec.config, spec.backend)
    run = Run(spec)
    if spec.stop_at_target and run.state.num_processes > 1:
        raise InputError("stop_at_target probes on the main process only: use it with one process")
    inputs = load(run)
    # what TRL's trainer runs where it has no choice and the settings say otherwise (a default, a preset's value, or
    # one the user gave a compare whose other rows read it): said before training, kept in summary.json
    differ = fixed_differences(spec.runner, spec.config)
    if differ and run.is_main:
        said = ", ".join(f"{name} (runs {theirs!r}, the settings {ours!r})" for name, (ours, theirs) in differ.items())
        print_fn(f"[{spec.backend}] {trl_trainer(spec.runner)[0]} has no choice in {said}")
    probe = None if spec.probe is None else (lambda policy: spec.probe(policy, inputs.tokenizer))
    recorder = RunRecorder(
        backend=spec.backend,
        probe=probe,
        probe_every=spec.probe_every,
        stop_at_target=spec.stop_at_target,
        log_path=run.out / "metrics.jsonl",
        print_fn=print_fn,
        seed=spec.config.seed,
        total_updates=num_updates(spec.config, run.state.num_processes),
        resume_after=run.resume_after,
        main_process=run.is_main,
    )
    try:
        runner = train_and_save(spec.runner, inputs, recorder, run.out)
    finally:
        recorder.close()
    history = recorder.history
    summary = {
        "backend": spec.backend,
        "config": spec.record,
        "sources": spec.sources,
        "updates": len(history),
        "world_size": runner.accelerator.num_processes,
        "fixed_by_trl": {name: theirs for name, (_, theirs) in differ.items()},
        **summarize(inputs, runner, recorder),
        "samples": history.samples,
    }
    if runner.accelerator.is_main_process:
        (run.out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary
