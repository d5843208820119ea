"""One PPO run on the doubling task with any backend, the same inputs and outputs (``trl-ext ppo``, and every
row of ``demo`` and ``compare``).

Writes to the output directory: the tuned policy (``save_pretrained``) with its value head, ``metrics.jsonl``
(one line per update), ``eval.json`` (greedy and sampled on held-out prompts) and ``summary.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from trl_ext.errors import InputError
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.option_scopes import single_turn_inert
from trl_ext.runs.run import ModelOptions, OutputOptions, train_options
from trl_ext.settings.fields import field, options_dict
from trl_ext.settings.layers import CommandOptions
from trl_ext.tasks.doubling.presets import BACKEND_NAMES, BACKENDS


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
        from trl_ext.tasks.doubling.task import check_held_out  # here: parsing the command imports no datasets

        check_held_out("eval_n", self.eval_n)
        check_held_out("probe_n", self.probe_n)
        if self.probe_every < 0:
            raise InputError(f"probe_every must not be negative, got {self.probe_every}")


@dataclass
class BackendOption:
    backend: str = field(
        "scratch",
        help="'scratch' (trl-ext's PPOTrainer), 'trl' (TRL's PPOTrainer, TRL <= 1.12), TRL's "
        "critic-free 'grpo'/'rloo'(-tuned) for comparison, or 'scratch-ALGO': ours set as those rows "
        "run. A critic-free row starts from its preset (trl_ext/tasks/doubling/presets.py), and so does "
        "'scratch' with --advantage-estimator grpo or rloo; the options you give (YAML, flags) "
        "apply over the preset",
        choices=BACKEND_NAMES,
    )

    def __post_init__(self):
        if self.backend not in BACKEND_NAMES:
            raise InputError(f"backend must be one of {', '.join(BACKEND_NAMES)}; got {self.backend!r}")


@dataclass
class PPORunOptions(CommandOptions):
    """Everything one ``ppo`` run takes, a part per concern (each part's fields are flags of the command)."""

    train: PPOConfig
    models: DoublingModels
    output: OutputOptions
    watch: WatchOptions
    run: BackendOption

    def inert_options(self, names) -> dict[str, str]:
        """Of ``names``, the options that would change nothing: for this backend's runner (``runners.inert_options``),
        and the multi-turn ones (the doubling task has no tools)."""
        from trl_ext.runs.runners import inert_options

        return {**inert_options(BACKENDS[self.run.backend].runner, self.train, names), **single_turn_inert(names)}


def ppo_options(
    train: PPOConfig,
    policy: str,
    reward: str | None,
    out: str,
    backend: str = "scratch",
    watch: WatchOptions | None = None,
    overwrite: bool = False,
    reward_fn: str | None = None,
    reward_url: str | None = None,
    sources: dict | None = None,
) -> PPORunOptions:
    """The ``ppo`` command's options built in Python (what ``demo``, ``compare`` and the benchmarks run): ``train``
    is the config the run trains with, as it is (a backend's preset: ``presets.row_config``)."""
    return PPORunOptions(
        train=train,
        models=DoublingModels(policy=policy, reward=reward, reward_fn=reward_fn, reward_url=reward_url),
        output=OutputOptions(out=out, overwrite=overwrite),
        watch=watch or WatchOptions(),
        run=BackendOption(backend=backend),
        sources=dict(sources or {}),
    )


def load_inputs(opts: PPORunOptions):
    """Policy, tokenizer and the reward function (classifier, the user's, a server), checked before training:
    both folders first (the one loader's checks), so a bad one fails before any model loads."""
    from trl_ext.models.loading import check_model_dir, load_policy
    from trl_ext.rewards.loading import reward_of
    from trl_ext.tasks.doubling.rewards import REWARD_DIR_LABELS, load_doubling_reward

    models = opts.models
    tokenizer = check_model_dir(models.policy, "policy")
    if models.reward:
        check_model_dir(models.reward, "reward model", **REWARD_DIR_LABELS)
    if opts.train.critic_init:
        check_model_dir(opts.train.critic_init, "critic_init", labels=1)
    # then the reward: a bad server or file fails fast
    reward_fn = reward_of(models.reward, models.reward_fn, models.reward_url, load_doubling_reward)
    policy, tokenizer = load_policy(opts.models.policy, tokenizer=tokenizer)
    return policy, tokenizer, reward_fn


def _rank_weight_digests(model, accelerator) -> list[str]:
    """One weights digest per process: equal digests mean the ranks' weights are bit-equal (in sync)."""
    from accelerate.utils import gather_object

    from trl_ext.models.digest import weights_digest

    local = [weights_digest(model.parameters())]
    return gather_object(local) if accelerator.num_processes > 1 else local


def run_record(opts: PPORunOptions) -> dict:
    """What a finished run is known by (``summary.json``'s config; ``compare`` reuses a run whose record is equal):
    its options and the trainer config it trained with, a row's preset in it."""
    return {**options_dict(opts), "trained_with": asdict(train_options(opts))}


def run_ppo(opts: PPORunOptions, print_fn=print) -> dict:
    """Train, evaluate and write one backend's run (``trl_ext.runs.run.run_training``); returns the summary (also
    ``summary.json``)."""
    from trl_ext.runs.run import RunSpec, run_training
    from trl_ext.runs.runners import RunInputs
    from trl_ext.tasks.doubling.evaluate import evaluate_policy, greedy_probe
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    backend, watch = opts.run.backend, opts.watch
    cfg = train_options(opts)
    spec = RunSpec(
        backend,
        BACKENDS[backend].runner,
        cfg,
        run_record(opts),
        opts.sources,
        overwrite=opts.output.overwrite,
        probe=partial(greedy_probe, n=watch.probe_n, seed=cfg.seed + 1),
        probe_every=watch.probe_every,
        stop_at_target=watch.stop_at_target,
    )

    def load(run) -> RunInputs:
        policy, tokenizer, reward_fn = load_inputs(opts)
        run.open_out()
        return RunInputs(
            cfg, policy, tokenizer, reward_fn, prompts=lambda n: ppo_prompt_dataset(tokenizer, n, cfg.seed)
        )

    def summarize(inputs, runner, recorder) -> dict:
        digests = _rank_weight_digests(runner.policy, runner.accelerator)  # every process takes part
        if not runner.accelerator.is_main_process:
            return {"rank_weight_digests": digests}
        report = evaluate_policy(runner.policy, inputs.tokenizer, n=watch.eval_n, seed=cfg.seed, sample=True)
        (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        train_seconds, last = recorder.train_seconds, recorder.history.last
        save_seconds = time.perf_counter() - recorder.stopped if recorder.stopped is not None else None
        return {
            "episodes": last.get("episode"),
            "train_seconds": round(train_seconds, 2),
            "setup_seconds": round(recorder.setup_seconds, 2),
            "save_seconds": round(save_seconds, 2) if save_seconds is not None else None,
            "episodes_per_second": round(last.get("episode", 0) / train_seconds, 2) if train_seconds else None,
            "reached_0_99": recorder.reached,
            "final_kl": last.get("objective/kl"),
            "greedy": _headline(report["greedy"]),
            "sampled": _headline(report["sampled"]),
            "rank_weight_digests": digests,
        }

    summary = run_training(spec, load, summarize, print_fn)
    if "greedy" in summary:  # the main process's
        summary["summary"] = (
            f"ppo[{backend}]: greedy exact={summary['greedy']['exact']:.3f} sampled "
            f"exact={summary['sampled']['exact']:.3f} after {summary['episodes']} episodes in "
            f"{summary['train_seconds']}s ({summary['episodes_per_second']} episodes/s)"
        )
    return summary


def _headline(metrics: dict) -> dict:
    return {k: metrics[k] for k in ("exact", "value_acc", "charset_acc", "finished")}
