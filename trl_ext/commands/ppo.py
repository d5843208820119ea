"""``trl-ext ppo``: PPO on the doubling task with either backend, the same inputs and outputs.

Writes to ``--out``: the tuned policy (``save_pretrained``) with its value head, ``metrics.jsonl``
(one line per update), ``eval.json`` (greedy and sampled on held-out prompts) and ``summary.json``.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from trl_ext.commands.outputs import OutputOptions, prepare_out_dir, train_options
from trl_ext.commands.parsing import Command, CommandResult, options_dict
from trl_ext.commands.quiet import stdout_without
from trl_ext.doubling.ppo_settings import DOUBLING_COMMAND_PPO
from trl_ext.errors import InputError
from trl_ext.options import field
from trl_ext.ppo.config import PPOConfig, num_updates

# 'grpo'/'rloo': TRL's critic-free trainers, for comparison; 'scratch-ALGO': ours with that estimator
BACKENDS = ("scratch", "trl", "grpo", "rloo", "scratch-grpo", "scratch-rloo", "scratch-reinforce_pp")
GROUP_SIZE = 8  # completions per prompt of every group row (train_group_baseline's num_generations)


def scratch_algorithm(backend: str, cfg: PPOConfig) -> dict:
    """The trainer options of a ``scratch-ALGO`` row: configured as TRL's GRPO/RLOO rows run (one gradient
    step per batch, gradient clipping at 1.0 as TRL's Trainer, ``kl_coef`` as their ``beta``), so the rows
    differ in the trainer only. REINFORCE++: KL-shaped token rewards, one completion per prompt."""
    one_step = dict(num_ppo_epochs=1, num_mini_batches=1, max_grad_norm=1.0)
    if backend == "scratch-grpo":  # TRL 1.16's default loss 'dapo' is 'bnpo' for one step per generation
        return dict(one_step, advantage_estimator="grpo", num_generations=GROUP_SIZE, kl_coef=0.0, beta=cfg.kl_coef,
                    loss_type="bnpo")
    if backend == "scratch-rloo":
        return dict(one_step, advantage_estimator="rloo", num_generations=GROUP_SIZE, kl_estimator="k1",
                    kl_mode="sequence", beta=0.0, policy_loss="sequence_clip", loss_type="grpo")
    if backend == "scratch-reinforce_pp":
        return dict(one_step, advantage_estimator="reinforce_pp", num_generations=1, beta=0.0)
    return {}


@dataclass
class DoublingModels:
    """The pretrained policy and what scores it."""

    policy: str = field(help="directory of the pretrained policy")
    reward: str | None = field(None, help="directory of the reward classifier (the doubling charset classifier)")
    reward_fn: str | None = field(None, help="your own reward function as 'module:callable' (TRL's reward_funcs "
                                  "convention); summed with --reward when both are given")
    reward_url: str | None = field(None, help="a reward server (`trl-ext serve-reward`) as the address it prints, "
                                   "e.g. http://127.0.0.1:8000; summed with --reward/--reward-fn when given")

    def __post_init__(self):
        if not self.reward and not self.reward_fn and not self.reward_url:
            raise InputError("give --reward (a classifier directory), --reward-fn (module:callable) or --reward-url")


@dataclass
class WatchOptions:
    """How a doubling run is watched: held-out probes during training, the final evaluation."""

    probe_every: int = field(10, help="updates between held-out greedy probes (0: never)")
    probe_n: int = field(200, help="held-out prompts per probe")
    eval_n: int = field(1000, help="held-out prompts for the final evaluation")
    stop_at_target: bool = field(False, help="stop once the probe's greedy exact-match reaches 0.99")

    def __post_init__(self):
        if not 0 < self.eval_n <= 1000 or not 0 < self.probe_n <= 1000:
            raise InputError("eval_n and probe_n must be in 1..1000")
        if self.probe_every < 0:
            raise InputError(f"probe_every must not be negative, got {self.probe_every}")


@dataclass
class BackendOption:
    backend: str = field("scratch", help="'scratch' (trl-ext's PPO), 'trl' (TRL's PPOTrainer, TRL <= 1.12), or "
                         "TRL's critic-free 'grpo'/'rloo' for comparison", choices=BACKENDS)

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise InputError(f"backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")


# The command's trainer options start from the doubling task's tuned values, not PPOConfig's LLM defaults.
DOUBLING_DEFAULTS = DOUBLING_COMMAND_PPO


def ppo_options(train: PPOConfig, policy: str, reward: str | None, out: str, backend: str = "scratch",
                watch: WatchOptions | None = None, overwrite: bool = False, reward_fn: str | None = None,
                reward_url: str | None = None):
    """The ``ppo`` command's options built in Python (what ``demo``, ``compare`` and the benchmarks run)."""
    return SimpleNamespace(train=train, models=DoublingModels(policy=policy, reward=reward, reward_fn=reward_fn,
                                                              reward_url=reward_url),
                           output=OutputOptions(out=out, overwrite=overwrite), watch=watch or WatchOptions(),
                           run=BackendOption(backend=backend))


def load_reward_dir(path: str):
    """The reward a classifier directory gives: a scalar reward model (num_labels=1, `train-reward-model`)
    scores as it is; the 4-class charset classifier gives the logit of the requested set."""
    from trl_ext.doubling.artifacts import load_classifier
    from trl_ext.doubling.rewards import doubling_classifier_reward
    from trl_ext.doubling.task import NUM_LABELS
    from trl_ext.rewards import ClassifierReward

    classifier, classifier_tokenizer = load_classifier(path, num_labels=None)
    labels = classifier.config.num_labels
    if labels == 1:
        return ClassifierReward(classifier, classifier_tokenizer, name="reward_model")
    if labels == NUM_LABELS:
        return doubling_classifier_reward(classifier, classifier_tokenizer)
    raise InputError(f"reward model {path!r} has {labels} labels; the doubling reward needs "
                     f"the {NUM_LABELS}-label charset classifier or a scalar reward model (num_labels=1)")


def load_inputs(opts):
    """Policy, tokenizer and the reward function (classifier, the user's, a server), checked before training."""
    from trl_ext.commands.serve_reward import connect_reward
    from trl_ext.doubling.artifacts import load_policy
    from trl_ext.rewards import WeightedSum
    from trl_ext.rewards.base import import_reward_function

    remote = connect_reward(opts.models.reward_url) if opts.models.reward_url else None  # first: no wait for nothing
    policy, tokenizer = load_policy(opts.models.policy)
    rewards = []
    if opts.models.reward:
        rewards.append(load_reward_dir(opts.models.reward))
    if opts.models.reward_fn:
        rewards.append(import_reward_function(opts.models.reward_fn))
    if remote is not None:
        rewards.append(remote)
    return policy, tokenizer, rewards[0] if len(rewards) == 1 else WeightedSum(rewards)


def train_backend(opts, policy, tokenizer, reward_fn, recorder, accelerator=None):
    """Run one backend to the end of its budget (or the target); returns the trained policy module."""
    from trl_ext.doubling.task import ppo_prompt_dataset

    backend, cfg, out = opts.run.backend, train_options(opts), Path(opts.output.out)
    dataset = ppo_prompt_dataset(tokenizer, cfg.total_episodes, cfg.seed)
    if backend.startswith("scratch"):
        from dataclasses import replace

        cfg = replace(cfg, **scratch_algorithm(backend, cfg))
        from trl_ext.ppo.trainer import PPOTrainer

        trainer = PPOTrainer(policy, reward_fn, args=cfg, train_dataset=dataset, processing_class=tokenizer,
                             accelerator=accelerator)
        recorder.begin()
        trainer.train(lambda update, stats: recorder.record(update, stats, trainer.policy))
        recorder.end()
        trainer.save(out)
        return trainer.policy, trainer.accelerator
    if backend in ("grpo", "rloo"):
        from accelerate import PartialState

        from trl_ext.baselines import group_prompt_count, train_group_baseline

        prompts = ppo_prompt_dataset(tokenizer, group_prompt_count(cfg, GROUP_SIZE), cfg.seed)
        train_group_baseline(backend, cfg, policy, tokenizer, reward_fn,
                             prompts.select_columns(["prompt", "label", "question"]), out, recorder,
                             num_generations=GROUP_SIZE)
        policy.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        return policy, PartialState()
    from transformers import TrainerCallback

    from trl_ext.trl_compat.backend import build_trl_trainer, save_trl_policy

    class _Stop(Exception):
        pass

    class _Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is not None and "objective/scores" in logs and recorder.record(state.global_step, logs, policy):
                raise _Stop  # TRL's PPO loop ignores control.should_training_stop

    trainer = build_trl_trainer(cfg, policy, tokenizer, reward_fn, dataset, out, callbacks=[_Record()])
    recorder.begin()
    # TRL's loop calls gc.collect() twice an update; frozen, the long-lived objects (models, datasets,
    # modules) are no longer scanned each time. Nothing is freed differently: they live for the run.
    gc.freeze()
    try:
        with stdout_without("===training policy==="):
            trainer.train()
    except _Stop:
        pass
    finally:
        gc.unfreeze()
    recorder.end()
    save_trl_policy(trainer, tokenizer, out)
    return policy, trainer.accelerator


def _rank_checksums(model, accelerator) -> list[float]:
    """One parameter checksum per process: equal numbers mean the ranks' weights are in sync."""
    import torch

    local = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())],
                         device=accelerator.device, dtype=torch.float64)
    return accelerator.gather(local).tolist() if accelerator.num_processes > 1 else local.tolist()


def run_ppo(opts, print_fn=print) -> dict:
    """Train, evaluate and write one backend's run; returns the summary (also ``summary.json``)."""
    import torch
    from accelerate import PartialState

    from trl_ext.commands.run_log import RunRecorder
    from trl_ext.doubling.evaluate import evaluate_policy

    backend, cfg, watch = opts.run.backend, opts.train, opts.watch
    if backend == "trl":
        from trl_ext.trl_compat import require_trl_ppo

        require_trl_ppo()
    # cpu=True when there is no GPU: under a multi-process launch that makes the ranks join over gloo
    # instead of each silently running alone.
    state = PartialState(cpu=not torch.cuda.is_available())
    if watch.stop_at_target and state.num_processes > 1:
        raise InputError("stop_at_target probes on the main process only: use it with one process")
    resume_after = None
    if cfg.resume_from_checkpoint:
        if not backend.startswith("scratch"):
            raise InputError(f"--resume-from-checkpoint resumes the scratch backends; {backend!r} cannot resume "
                             "(TRL 1.12's PPOTrainer.train() takes no checkpoint)")
        from trl_ext.ppo import checkpoint

        found = checkpoint.resolve(cfg.resume_from_checkpoint, opts.output.out)
        resume_after = checkpoint.read_state(found)["update"]
    policy, tokenizer, reward_fn = load_inputs(opts)
    if state.is_main_process:  # a resumed run writes on into its own directory
        prepare_out_dir(opts.output.out, opts.output.overwrite or resume_after is not None)
    state.wait_for_everyone()
    out = Path(opts.output.out)
    main = state.is_main_process
    recorder = RunRecorder(tokenizer, backend=backend, probe_every=watch.probe_every if main else 0,
                           probe_n=watch.probe_n, stop_at_target=watch.stop_at_target,
                           log_path=out / "metrics.jsonl" if main else None,
                           print_fn=print_fn if main else (lambda *_: None), seed=cfg.seed,
                           total_updates=num_updates(cfg, state.num_processes), resume_after=resume_after)
    try:
        trained, accelerator = train_backend(opts, policy, tokenizer, reward_fn, recorder)
    finally:
        recorder.close()
    train_seconds = recorder.train_seconds
    save_seconds = time.perf_counter() - recorder.stopped if recorder.stopped is not None else None
    checksums = _rank_checksums(trained, accelerator)
    summary = {"backend": backend, "config": options_dict(opts)}
    if accelerator.is_main_process:
        report = evaluate_policy(trained, tokenizer, n=watch.eval_n, seed=cfg.seed, sample=True)
        (out / "eval.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        last = recorder.history[-1] if recorder.history else {}
        summary.update(
            updates=len(recorder.history), episodes=last.get("episode"), train_seconds=round(train_seconds, 2),
            setup_seconds=round(recorder.setup_seconds, 2),
            save_seconds=round(save_seconds, 2) if save_seconds is not None else None,
            episodes_per_second=round(last.get("episode", 0) / train_seconds, 2) if train_seconds else None,
            reached_0_99=recorder.reached, final_kl=last.get("objective/kl"),
            greedy=_headline(report["greedy"]), sampled=_headline(report["sampled"]),
            world_size=accelerator.num_processes, rank_checksums=checksums,
        )
        (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        summary["summary"] = (f"ppo[{backend}]: greedy exact={report['greedy']['exact']:.3f} sampled "
                              f"exact={report['sampled']['exact']:.3f} after {summary['episodes']} episodes in "
                              f"{summary['train_seconds']}s ({summary['episodes_per_second']} episodes/s)")
    return summary


def _headline(metrics: dict) -> dict:
    return {k: metrics[k] for k in ("exact", "value_acc", "charset_acc", "finished")}


def ppo_command(opts) -> CommandResult:
    summary = run_ppo(opts)
    return CommandResult(summary.get("summary", "ppo: done"), summary)


COMMAND = Command(
    help="PPO on the doubling task with the scratch or trl backend (or TRL's GRPO/RLOO)",
    parts={"train": PPOConfig, "models": DoublingModels, "output": OutputOptions, "watch": WatchOptions,
           "run": BackendOption},
    run=ppo_command, defaults=DOUBLING_DEFAULTS,
)
