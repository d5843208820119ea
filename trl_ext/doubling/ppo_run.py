"""One PPO run on the doubling task with any backend, the same inputs and outputs (``trl-ext ppo``, and every
row of ``demo`` and ``compare``).

Writes to the output directory: the tuned policy (``save_pretrained``) with its value head, ``metrics.jsonl``
(one line per update), ``eval.json`` (greedy and sampled on held-out prompts) and ``summary.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trl_ext.doubling.presets import BACKEND_NAMES, BACKENDS
from trl_ext.errors import InputError
from trl_ext.options import field, options_dict
from trl_ext.ppo.config import PPOConfig, num_updates
from trl_ext.runs import ModelOptions, OutputOptions, prepare_out_dir, train_options


@dataclass
class DoublingModels(ModelOptions):
    """The pretrained policy and what scores it."""

    policy: str = field(help="directory of the pretrained policy")
    reward: str | None = field(None, help="directory of the reward classifier (the doubling charset classifier)")

    def __post_init__(self):
        if not self.has_reward:
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
    backend: str = field("scratch", help="'scratch' (trl-ext's PPO), 'trl' (TRL's PPOTrainer, TRL <= 1.12), "
                         "TRL's critic-free 'grpo'/'rloo' for comparison, or 'scratch-ALGO': ours set as those rows "
                         "run (their estimator, epochs, clipping and KL options, and the -tuned and -quick rows' "
                         "learning rate and reward scaling, replace the flags; README, 'Critic-free estimators')",
                         choices=BACKEND_NAMES)

    def __post_init__(self):
        if self.backend not in BACKEND_NAMES:
            raise InputError(f"backend must be one of {', '.join(BACKEND_NAMES)}; got {self.backend!r}")


@dataclass
class PPORunOptions:
    """Everything one ``ppo`` run takes, a part per concern (each part's fields are flags of the command)."""

    train: PPOConfig
    models: DoublingModels
    output: OutputOptions
    watch: WatchOptions
    run: BackendOption


def ppo_options(train: PPOConfig, policy: str, reward: str | None, out: str, backend: str = "scratch",
                watch: WatchOptions | None = None, overwrite: bool = False, reward_fn: str | None = None,
                reward_url: str | None = None) -> PPORunOptions:
    """The ``ppo`` command's options built in Python (what ``demo``, ``compare`` and the benchmarks run)."""
    return PPORunOptions(train=train, models=DoublingModels(policy=policy, reward=reward, reward_fn=reward_fn,
                                                            reward_url=reward_url),
                         output=OutputOptions(out=out, overwrite=overwrite), watch=watch or WatchOptions(),
                         run=BackendOption(backend=backend))


def load_inputs(opts: PPORunOptions):
    """Policy, tokenizer and the reward function (classifier, the user's, a server), checked before training:
    both folders first (the one loader's checks), so a bad one fails before any model loads."""
    from trl_ext.doubling.rewards import REWARD_DIR_LABELS, load_doubling_reward
    from trl_ext.model_loading import check_model_dir, load_policy
    from trl_ext.rewards.loading import reward_of

    models = opts.models
    tokenizer = check_model_dir(models.policy, "policy")
    if models.reward:
        check_model_dir(models.reward, "reward model", **REWARD_DIR_LABELS)
    # then the reward: a bad server or file fails fast
    reward_fn = reward_of(models.reward, models.reward_fn, models.reward_url, load_doubling_reward)
    policy, tokenizer = load_policy(opts.models.policy, tokenizer=tokenizer)
    return policy, tokenizer, reward_fn


def _rank_checksums(model, accelerator) -> list[float]:
    """One parameter checksum per process: equal numbers mean the ranks' weights are in sync."""
    import torch

    local = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())],
                         device=accelerator.device, dtype=torch.float64)
    return accelerator.gather(local).tolist() if accelerator.num_processes > 1 else local.tolist()


def run_record(opts: PPORunOptions) -> dict:
    """What a finished run is known by (``summary.json``'s config; ``compare`` reuses a run whose record is equal):
    its options and the trainer config its backend made of them, which a ``scratch-ALGO`` row's code decides."""
    return {**options_dict(opts), "trained_with": asdict(BACKENDS[opts.run.backend].row_config(train_options(opts)))}


def run_ppo(opts: PPORunOptions, print_fn=print) -> dict:
    """Train, evaluate and write one backend's run; returns the summary (also ``summary.json``)."""
    import torch
    from accelerate import PartialState

    from trl_ext.doubling.evaluate import evaluate_policy
    from trl_ext.doubling.task import ppo_prompt_dataset
    from trl_ext.run_log import RunRecorder
    from trl_ext.runners import RunInputs, check_runnable, train_and_save
    from trl_ext.runs import resumed_update

    backend, cfg, watch = opts.run.backend, opts.train, opts.watch
    check_runnable(BACKENDS[backend].runner, cfg, backend)
    # cpu=True when there is no GPU: under a multi-process launch that makes the ranks join over gloo
    # instead of each silently running alone.
    state = PartialState(cpu=not torch.cuda.is_available())
    if watch.stop_at_target and state.num_processes > 1:
        raise InputError("stop_at_target probes on the main process only: use it with one process")
    resume_after = resumed_update(cfg, opts.output.out)
    policy, tokenizer, reward_fn = load_inputs(opts)
    if state.is_main_process:  # a resumed run writes on into its own directory
        prepare_out_dir(opts.output.out, opts.output.overwrite or resume_after is not None)
    state.wait_for_everyone()
    out = Path(opts.output.out)

    def probe(policy) -> dict:  # greedy, on held-out prompts of another seed than the final evaluation's
        greedy = evaluate_policy(policy, tokenizer, n=watch.probe_n, seed=cfg.seed + 1, sample=False)["greedy"]
        return {"exact": greedy["exact"], "charset_acc": greedy["charset_acc"]}

    recorder = RunRecorder(backend=backend, probe=probe, probe_every=watch.probe_every, target_metric="exact",
                           target=0.99, stop_at_target=watch.stop_at_target, log_path=out / "metrics.jsonl",
                           print_fn=print_fn, seed=cfg.seed, total_updates=num_updates(cfg, state.num_processes),
                           resume_after=resume_after, main_process=state.is_main_process)
    inputs = RunInputs(BACKENDS[backend].row_config(train_options(opts)), policy, tokenizer, reward_fn,
                       prompts=lambda n: ppo_prompt_dataset(tokenizer, n, cfg.seed))
    try:
        runner = train_and_save(BACKENDS[backend].runner, inputs, recorder, out)
    finally:
        recorder.close()
    train_seconds, history = recorder.train_seconds, recorder.history
    save_seconds = time.perf_counter() - recorder.stopped if recorder.stopped is not None else None
    accelerator = runner.accelerator
    checksums = _rank_checksums(runner.policy, accelerator)
    summary = {"backend": backend, "config": run_record(opts)}
    if accelerator.is_main_process:
        report = evaluate_policy(runner.policy, tokenizer, n=watch.eval_n, seed=cfg.seed, sample=True)
        (out / "eval.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        last = history.last
        summary.update(
            updates=len(history), episodes=last.get("episode"), train_seconds=round(train_seconds, 2),
            setup_seconds=round(recorder.setup_seconds, 2),
            save_seconds=round(save_seconds, 2) if save_seconds is not None else None,
            episodes_per_second=round(last.get("episode", 0) / train_seconds, 2) if train_seconds else None,
            reached_0_99=recorder.reached, final_kl=last.get("objective/kl"),
            greedy=_headline(report["greedy"]), sampled=_headline(report["sampled"]),
            world_size=accelerator.num_processes, rank_checksums=checksums, samples=history.samples,
        )
        (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        summary["summary"] = (f"ppo[{backend}]: greedy exact={report['greedy']['exact']:.3f} sampled "
                              f"exact={report['sampled']['exact']:.3f} after {summary['episodes']} episodes in "
                              f"{summary['train_seconds']}s ({summary['episodes_per_second']} episodes/s)")
    return summary


def _headline(metrics: dict) -> dict:
    return {k: metrics[k] for k in ("exact", "value_acc", "charset_acc", "finished")}
