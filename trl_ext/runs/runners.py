"""The trainers a run can train with, behind one small runner protocol: ``RUNNERS`` by name.

A runner is built from ``RunInputs`` (the trainer is ready when the constructor returns), ``train(on_update)``
hands every update's stats to ``on_update(update, stats)`` and stops early when it returns True, and
``save(out)`` writes the policy. It trains with the config it is given: which settings a named backend of the
doubling commands adds is the task's (``trl_ext.tasks.doubling.presets``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from trl_ext.errors import InputError
from trl_ext.ppo.config import PPOConfig

OnUpdate = Callable[[int, dict], bool]


@dataclass
class RunInputs:
    """What every runner is built from."""

    config: PPOConfig  # its output_dir is the run's
    policy: Any
    tokenizer: Any
    reward_fn: Callable
    prompts: Callable[[int], Any]  # n -> a dataset of n rows: input_ids, prompt and the reward's columns
    peft_config: Any = None
    agent: dict | None = None  # multi-turn rollouts: PPOTrainer's tools and environment_factory (our runner only)


class Runner(Protocol):
    resumable: bool  # from our trainer's checkpoints
    needs_trl_ppo: bool  # TRL <= 1.12's PPO
    policy: Any  # the trained policy module, for probes, evaluation and checksums
    accelerator: Any  # what the run's processes share: is_main_process, num_processes, gather

    def train(self, on_update: OnUpdate) -> None: ...

    def save(self, out: Path) -> None: ...


class ScratchRunner:
    """The scratch trainer: trl-ext's PPOTrainer."""

    resumable, needs_trl_ppo = True, False

    def __init__(self, inputs: RunInputs):
        from trl_ext.ppo.trainer import PPOTrainer

        cfg = inputs.config
        self.trainer = PPOTrainer(
            inputs.policy,
            inputs.reward_fn,
            args=cfg,
            train_dataset=inputs.prompts(cfg.total_episodes),
            processing_class=inputs.tokenizer,
            peft_config=inputs.peft_config,
            **(inputs.agent or {}),
        )
        self.accelerator = self.trainer.accelerator

    @property
    def policy(self):
        return self.trainer.policy

    def train(self, on_update: OnUpdate) -> None:
        self.trainer.train(on_update)

    def save(self, out: Path) -> None:
        self.trainer.save(out)


class _StopTraining(Exception):
    """Raised out of a TRL trainer's loop to end it early: TRL's PPO loop ignores control.should_training_stop."""


def _train_reporting(
    trainer,
    on_update: OnUpdate,
    metrics_of: Callable[[dict, Any], dict | None],
    update_of: Callable[[Any], int] = lambda state: state.global_step,
) -> None:
    """``trainer.train()`` for a transformers/TRL trainer, each update's log handed to ``on_update``
    (``metrics_of(logs, state)`` picks the update logs and names their metrics as ours, ``update_of(state)``
    numbers the update)."""
    from transformers import TrainerCallback

    class Report(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            metrics = metrics_of(logs or {}, state)
            if metrics is not None and on_update(update_of(state), metrics):
                raise _StopTraining

    trainer.add_callback(Report())
    try:
        trainer.train()
    except _StopTraining:
        pass


class _WithoutLines:
    """A text stream that passes everything on but the given whole lines."""

    def __init__(self, stream, hidden: frozenset[str]):
        self.stream, self.hidden, self.pending = stream, hidden, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            if line not in self.hidden:
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


@contextmanager
def stdout_without(*lines: str):
    """Run a block with these whole lines dropped from what it prints (TRL 1.12's PPO prints a banner)."""
    stream = _WithoutLines(sys.stdout, frozenset(lines))
    with redirect_stdout(stream):
        yield
    if stream.pending:
        sys.stdout.write(stream.pending)


class TRLPPORunner:
    """TRL 1.12's PPOTrainer (``trl.experimental.ppo``) on the same pieces."""

    resumable, needs_trl_ppo = False, True  # TRL 1.12's PPOTrainer.train() takes no checkpoint

    def __init__(self, inputs: RunInputs):
        from trl_ext.trl_compat.backend import build_trl_trainer

        cfg = inputs.config
        self.policy, self.tokenizer = inputs.policy, inputs.tokenizer
        self.trainer = build_trl_trainer(
            cfg,
            inputs.policy,
            inputs.tokenizer,
            inputs.reward_fn,
            inputs.prompts(cfg.total_episodes),
            cfg.output_dir,
            peft_config=inputs.peft_config,
        )
        self.accelerator = self.trainer.accelerator

    def train(self, on_update: OnUpdate) -> None:
        import gc

        # TRL's loop calls gc.collect() twice an update; frozen, the long-lived objects (models, datasets,
        # modules) are no longer scanned each time. Nothing is freed differently: they live for the run.
        gc.freeze()
        try:
            with stdout_without("===training policy==="):
                _train_reporting(
                    self.trainer, on_update, lambda logs, state: logs if "objective/scores" in logs else None
                )
        finally:
            gc.unfreeze()

    def save(self, out: Path) -> None:
        from trl_ext.trl_compat.backend import save_trl_policy

        save_trl_policy(self.trainer, self.tokenizer, out)


class GroupRunner:
    """TRL's GRPO or RLOO (``kind``), critic-free rows to compare with, run with our config (``build_group_trainer``
    maps it to theirs)."""

    kind: str
    resumable, needs_trl_ppo = False, False

    def __init__(self, inputs: RunInputs):
        from trl_ext.runs.group_trainers import build_group_trainer, group_prompt_count

        cfg = inputs.config
        self.policy, self.tokenizer, self.batch_size = inputs.policy, inputs.tokenizer, cfg.batch_size
        self.iterations = cfg.num_ppo_epochs * cfg.num_mini_batches  # optimizer steps a generated batch
        # They tokenize the 'prompt' column themselves; the other columns reach the reward, as in our trainer.
        prompts = inputs.prompts(group_prompt_count(cfg, cfg.num_generations)).remove_columns("input_ids")
        self.trainer = build_group_trainer(
            self.kind,
            cfg,
            inputs.policy,
            inputs.tokenizer,
            inputs.reward_fn,
            prompts,
            cfg.output_dir,
            num_generations=cfg.num_generations,
        )
        self.accelerator = self.trainer.accelerator
        self._batch_metrics: dict | None = None

    def _update(self, state) -> int:
        """The generated batch a step belongs to: ``num_iterations`` x ``steps_per_generation`` optimizer steps each
        (our update)."""
        return -(-state.global_step // self.iterations)

    def _metrics(self, logs: dict, state) -> dict | None:
        """A batch's metrics once its last optimizer step is taken: the scores are logged on its first step, but
        a probe or a stop at that point would see a half-updated policy."""
        if "reward" in logs:
            self._batch_metrics = {
                "objective/scores": logs["reward"],
                "objective/kl": logs.get("kl", 0.0),
                "episode": self._update(state) * self.batch_size,
            }
        if self._batch_metrics is None or state.global_step % self.iterations:
            return None
        metrics, self._batch_metrics = self._batch_metrics, None
        return metrics

    def train(self, on_update: OnUpdate) -> None:
        _train_reporting(self.trainer, on_update, self._metrics, self._update)

    def save(self, out: Path) -> None:
        self.policy.save_pretrained(out, safe_serialization=True)
        self.tokenizer.save_pretrained(out)


class GRPORunner(GroupRunner):
    kind = "grpo"


class RLOORunner(GroupRunner):
    kind = "rloo"


RUNNERS: dict[str, type] = {"scratch": ScratchRunner, "trl": TRLPPORunner, "grpo": GRPORunner, "rloo": RLOORunner}


def check_runnable(runner: str, cfg: PPOConfig, name: str | None = None) -> None:
    """Before anything loads or is written: TRL's PPO installed where the runner needs it, vLLM where the sampler is
    vLLM (the scratch trainer only: TRL's trainers would ignore the option), a resume only where it can (``name``:
    the backend as the user named it)."""
    if cfg.kl_target is not None and runner != "scratch":
        raise InputError(
            f"--kl-target adapts the scratch trainer's KL weight; backend {name or runner!r} keeps "
            "its KL weight fixed (TRL's trainers have no adaptive KL controller)"
        )
    if cfg.sampler == "vllm":
        if runner != "scratch":
            raise InputError(
                f"--sampler vllm is the scratch trainer's rollout engine; backend {name or runner!r} "
                "generates with TRL's own code and would ignore it"
            )
        from trl_ext.ppo.rollout.vllm_sampler import require_vllm

        require_vllm()
    if RUNNERS[runner].needs_trl_ppo:
        from trl_ext.trl_compat import require_trl_ppo

        require_trl_ppo()
    if cfg.resume_from_checkpoint and not RUNNERS[runner].resumable:
        raise InputError(
            f"--resume-from-checkpoint resumes the scratch backends; {name or runner!r} cannot resume "
            "(TRL 1.12's PPOTrainer.train() takes no checkpoint)"
        )


# What the run reads of the config whatever trains: where it writes, the seed, the checkpoint it resumes
# (check_runnable refuses one a runner cannot take).
RUN_READS = frozenset(("output_dir", "seed", "resume_from_checkpoint"))


def trl_trainer(runner: str) -> tuple[str, frozenset, dict]:
    """TRL's trainer behind ``runner``: its name, the options of ours it reads, those it fixes (at what value)."""
    if runner == "trl":
        from trl_ext.trl_compat.backend import TRL_PPO_FIXED, TRL_PPO_READS

        return "TRL's PPO", TRL_PPO_READS, TRL_PPO_FIXED
    from trl_ext.runs.group_trainers import TRL_GROUP_FIXED, TRL_GROUP_READS

    return f"TRL's {runner.upper()}", TRL_GROUP_READS[runner], TRL_GROUP_FIXED[runner]


def fixed_differences(runner: str, cfg: PPOConfig) -> dict[str, tuple]:
    """``{option: (cfg's value, what TRL's trainer runs)}`` for each option ``runner``'s TRL trainer fixes at another
    value than ``cfg``'s: where that row of a comparison runs otherwise than its config says (none for scratch)."""
    if runner == "scratch":
        return {}
    from trl_ext.ppo.advantages import whitens

    _, _, fixed = trl_trainer(runner)
    ours = {name: whitens(cfg) if name == "whiten_advantages" else getattr(cfg, name) for name in fixed}
    return {name: (value, fixed[name]) for name, value in ours.items() if value != fixed[name]}


SCOPED_AS_OURS = ("save_total_limit", "use_bias_correction_kl")


def inert_options(runner: str, cfg: PPOConfig, names) -> dict[str, str]:
    """Of ``names``, the options that would not change ``runner``'s run, each with what it acts with: the scratch
    trainer's scopes (``PPOConfig.inert_options``); for TRL's trainers, an option of ours they never read or fix at
    another value, and a checkpoint limit without checkpoints."""
    if runner == "scratch":
        return cfg.inert_options(names)
    trainer, reads, fixed = trl_trainer(runner)
    ours, differ = {f.name for f in fields(PPOConfig)} - RUN_READS, fixed_differences(runner, cfg)
    inert = {}
    for name in names:
        if name in fixed:
            if name in differ:
                inert[name] = f"backend 'scratch' ({trainer} runs {fixed[name]!r})"
        elif name in ours and name not in reads:
            inert[name] = f"backend 'scratch' ({trainer} never reads it)"
    # options TRL reads that act only with another, as in ours (checkpoints, beta's KL term): the scratch scope's rule
    scoped = [n for n in names if n in SCOPED_AS_OURS and n in reads]
    inert.update(cfg.inert_options(scoped))
    return inert


def train_and_save(runner: str, inputs: RunInputs, recorder, out: str | Path) -> Runner:
    """Build the runner, train it with ``recorder`` seeing every update, save the policy in ``out``.
    The recorder's clock covers training only: building comes before ``begin()``, saving after ``end()``."""
    trainer = RUNNERS[runner](inputs)
    recorder.begin()
    trainer.train(lambda update, stats: recorder.record(update, stats, trainer.policy))
    recorder.end()
    trainer.save(Path(out))
    return trainer
