"""The trainers a PPO command can run, behind one small runner protocol and one registry.

A runner is built from ``RunInputs`` (the trainer is ready when the constructor returns), ``train(on_update)``
hands every update's stats to ``on_update(update, stats)`` and stops early when it returns True, and
``save(out)`` writes the policy. ``ppo`` and ``rlhf`` both run theirs with ``train_and_save``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Protocol

from trl_ext.errors import InputError
from trl_ext.ppo.config import PPOConfig

OnUpdate = Callable[[int, dict], bool]
GROUP_SIZE = 8  # completions per prompt of every group row (GRPO/RLOO and our trainer with their estimators)


@dataclass
class RunInputs:
    """What every runner is built from."""

    config: PPOConfig  # its output_dir is the run's
    policy: Any
    tokenizer: Any
    reward_fn: Callable
    prompts: Callable[[int], Any]  # n -> a dataset of n rows: input_ids, prompt and the reward's columns
    peft_config: Any = None


class Runner(Protocol):
    policy: Any  # the trained policy module, for probes, evaluation and checksums
    accelerator: Any  # what the run's processes share: is_main_process, num_processes, gather

    def train(self, on_update: OnUpdate) -> None: ...

    def save(self, out: Path) -> None: ...


class ScratchRunner:
    """trl-ext's own PPOTrainer."""

    def __init__(self, inputs: RunInputs):
        from trl_ext.ppo.trainer import PPOTrainer

        cfg = inputs.config
        self.trainer = PPOTrainer(inputs.policy, inputs.reward_fn, args=cfg, train_dataset=inputs.prompts(
            cfg.total_episodes), processing_class=inputs.tokenizer, peft_config=inputs.peft_config)
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


def _train_reporting(trainer, on_update: OnUpdate, metrics_of: Callable[[dict, Any], dict | None],
                     update_of: Callable[[Any], int] = lambda state: state.global_step) -> None:
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


class TRLPPORunner:
    """TRL 1.12's PPOTrainer (``trl.experimental.ppo``) on the same pieces."""

    def __init__(self, inputs: RunInputs):
        from trl_ext.trl_compat.backend import build_trl_trainer

        cfg = inputs.config
        self.policy, self.tokenizer = inputs.policy, inputs.tokenizer
        self.trainer = build_trl_trainer(cfg, inputs.policy, inputs.tokenizer, inputs.reward_fn,
                                         inputs.prompts(cfg.total_episodes), cfg.output_dir,
                                         peft_config=inputs.peft_config)
        self.accelerator = self.trainer.accelerator

    def train(self, on_update: OnUpdate) -> None:
        import gc

        from trl_ext.commands.quiet import stdout_without

        # TRL's loop calls gc.collect() twice an update; frozen, the long-lived objects (models, datasets,
        # modules) are no longer scanned each time. Nothing is freed differently: they live for the run.
        gc.freeze()
        try:
            with stdout_without("===training policy==="):
                _train_reporting(self.trainer, on_update,
                                 lambda logs, state: logs if "objective/scores" in logs else None)
        finally:
            gc.unfreeze()

    def save(self, out: Path) -> None:
        from trl_ext.trl_compat.backend import save_trl_policy

        save_trl_policy(self.trainer, self.tokenizer, out)


class GroupRunner:
    """TRL's GRPO or RLOO (``kind``), critic-free rows to compare with, run with our config (the one our
    ``scratch-ALGO`` row of that name runs: ``build_group_trainer`` maps it to theirs)."""

    def __init__(self, kind: str, inputs: RunInputs):
        from trl_ext.baselines import build_group_trainer, group_prompt_count

        cfg = inputs.config
        self.policy, self.tokenizer, self.batch_size = inputs.policy, inputs.tokenizer, cfg.batch_size
        self.iterations = cfg.num_ppo_epochs
        # They tokenize the 'prompt' column themselves; the other columns reach the reward, as in our trainer.
        prompts = inputs.prompts(group_prompt_count(cfg, GROUP_SIZE)).remove_columns("input_ids")
        self.trainer = build_group_trainer(kind, cfg, inputs.policy, inputs.tokenizer, inputs.reward_fn, prompts,
                                           cfg.output_dir, num_generations=GROUP_SIZE)
        self.accelerator = self.trainer.accelerator
        self._batch_metrics: dict | None = None

    def _update(self, state) -> int:
        """The generated batch a step belongs to: ``num_iterations`` optimizer steps each (our update)."""
        return -(-state.global_step // self.iterations)

    def _metrics(self, logs: dict, state) -> dict | None:
        """A batch's metrics once its last optimizer step is taken: the scores are logged on its first step, but
        a probe or a stop at that point would see a half-updated policy."""
        if "reward" in logs:
            self._batch_metrics = {"objective/scores": logs["reward"], "objective/kl": logs.get("kl", 0.0),
                                   "episode": self._update(state) * self.batch_size}
        if self._batch_metrics is None or state.global_step % self.iterations:
            return None
        metrics, self._batch_metrics = self._batch_metrics, None
        return metrics

    def train(self, on_update: OnUpdate) -> None:
        _train_reporting(self.trainer, on_update, self._metrics, self._update)

    def save(self, out: Path) -> None:
        self.policy.save_pretrained(out, safe_serialization=True)
        self.tokenizer.save_pretrained(out)


# Our trainer configured as TRL's GRPO/RLOO rows run (one gradient step per batch, gradient clipping at 1.0
# as TRL's Trainer, kl_coef as their beta), so those rows differ in the trainer only.
_ONE_STEP = dict(num_ppo_epochs=1, num_mini_batches=1, max_grad_norm=1.0)


# 'bnpo': TRL's default 'dapo' is the same in one process with one step a generation (across ranks, 'dapo'
# normalises by every rank's tokens)
def _as_grpo(cfg: PPOConfig) -> dict:
    return dict(_ONE_STEP, advantage_estimator="grpo", num_generations=GROUP_SIZE, kl_coef=0.0, beta=cfg.kl_coef,
                loss_type="bnpo")


def _as_rloo(cfg: PPOConfig) -> dict:
    return dict(_ONE_STEP, advantage_estimator="rloo", num_generations=GROUP_SIZE, kl_estimator="k1",
                kl_mode="sequence", beta=0.0, policy_loss="sequence_clip", loss_type="grpo")


# The best critic-free settings found on the doubling task (README, "Critic-free estimators"). GRPO scales by the
# batch's std, not each group's: a group of near-equal scores had its noise blown up to unit size. '-quick' keeps
# one gradient step a batch (TRL's rows' speed) at lr 7e-4: 3e-4 ended less sharp when sampled, and 1e-3 broke one
# RLOO run of three on a second CPU (its KL spiking to 5; greedy 0.983). '-tuned' takes two epochs over each batch
# (TRL's num_iterations) at lr 1e-3: a little sharper, at about 1.5x the time.
def _as_rloo_quick(cfg: PPOConfig) -> dict:
    return dict(_as_rloo(cfg), learning_rate=7e-4)


def _as_grpo_quick(cfg: PPOConfig) -> dict:
    return dict(_as_grpo(cfg), learning_rate=7e-4, scale_rewards="batch")


def _as_rloo_tuned(cfg: PPOConfig) -> dict:
    return dict(_as_rloo_quick(cfg), num_ppo_epochs=2, learning_rate=1e-3)


def _as_grpo_tuned(cfg: PPOConfig) -> dict:
    return dict(_as_grpo_quick(cfg), num_ppo_epochs=2, learning_rate=1e-3)


def _as_reinforce_pp(cfg: PPOConfig) -> dict:  # KL-shaped token rewards, one completion per prompt
    return dict(_ONE_STEP, advantage_estimator="reinforce_pp", num_generations=1, beta=0.0)


@dataclass(frozen=True)
class Backend:
    runner: Callable[[RunInputs], Runner]
    algorithm: Callable[[PPOConfig], dict] | None = None  # a row's own settings, replacing the command line's
    resumable: bool = False  # from our trainer's checkpoints; TRL 1.12's PPOTrainer.train() takes none
    needs_trl_ppo: bool = False

    def row_config(self, cfg: PPOConfig) -> PPOConfig:
        """The config this backend trains with, given the command's."""
        return replace(cfg, **self.algorithm(cfg)) if self.algorithm else cfg

    def build(self, inputs: RunInputs) -> Runner:
        return self.runner(replace(inputs, config=self.row_config(inputs.config)))


# 'grpo'/'rloo'(-tuned): TRL's critic-free trainers, for comparison; 'scratch-ALGO': ours with the same config (a
# row's options replace those of the command line: a row is one fixed configuration)
RUNNERS: dict[str, Backend] = {
    "scratch": Backend(ScratchRunner, resumable=True),
    "trl": Backend(TRLPPORunner, needs_trl_ppo=True),
    "grpo": Backend(partial(GroupRunner, "grpo"), _as_grpo),
    "rloo": Backend(partial(GroupRunner, "rloo"), _as_rloo),
    "grpo-tuned": Backend(partial(GroupRunner, "grpo"), _as_grpo_tuned),
    "rloo-tuned": Backend(partial(GroupRunner, "rloo"), _as_rloo_tuned),
    "scratch-grpo": Backend(ScratchRunner, _as_grpo, resumable=True),
    "scratch-rloo": Backend(ScratchRunner, _as_rloo, resumable=True),
    "scratch-reinforce_pp": Backend(ScratchRunner, _as_reinforce_pp, resumable=True),
    "scratch-grpo-tuned": Backend(ScratchRunner, _as_grpo_tuned, resumable=True),
    "scratch-rloo-tuned": Backend(ScratchRunner, _as_rloo_tuned, resumable=True),
    "scratch-grpo-quick": Backend(ScratchRunner, _as_grpo_quick, resumable=True),
    "scratch-rloo-quick": Backend(ScratchRunner, _as_rloo_quick, resumable=True),
}
BACKENDS = tuple(RUNNERS)


def check_runnable(backend: str, cfg: PPOConfig) -> None:
    """Before anything loads: TRL's PPO installed where the backend needs it, a resume only where it can."""
    if RUNNERS[backend].needs_trl_ppo:
        from trl_ext.trl_compat import require_trl_ppo

        require_trl_ppo()
    if cfg.resume_from_checkpoint and not RUNNERS[backend].resumable:
        raise InputError(f"--resume-from-checkpoint resumes the scratch backends; {backend!r} cannot resume "
                         "(TRL 1.12's PPOTrainer.train() takes no checkpoint)")


def resumed_update(cfg: PPOConfig, out: str | Path) -> int | None:
    """The update a ``--resume-from-checkpoint`` run goes on after; None for a fresh run."""
    if not cfg.resume_from_checkpoint:
        return None
    from trl_ext.ppo import checkpoint

    return checkpoint.read_state(checkpoint.resolve(cfg.resume_from_checkpoint, out))["update"]


def train_and_save(backend: str, inputs: RunInputs, recorder, out: str | Path) -> Runner:
    """Build the backend's runner, train it with ``recorder`` seeing every update, save the policy in ``out``.
    The recorder's clock covers training only: building comes before ``begin()``, saving after ``end()``."""
    runner = RUNNERS[backend].build(inputs)
    recorder.begin()
    runner.train(lambda update, stats: recorder.record(update, stats, runner.policy))
    recorder.end()
    runner.save(Path(out))
    return runner
