"""The whole doubling pipeline of ``trl-ext demo`` and ``trl-ext compare``: the supervised stages, then PPO runs
(backend x reward x seed) side by side, then their table, report and curves.

Each stage writes into its own folder of ``--out`` and finishes by writing its marker file
(``metrics.json`` or ``summary.json``); a later run reuses every finished stage whose options
did not change, so an interrupted demo resumes where it stopped. Nothing is ever deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.option_scopes import single_turn_inert
from trl_ext.runs.recorder import read_history
from trl_ext.runs.run import OutputOptions, prepare_out_dir
from trl_ext.runs.runners import fixed_differences, trl_trainer
from trl_ext.settings.fields import options_dict
from trl_ext.settings.layers import CommandOptions
from trl_ext.stages.reuse import reuse_or_run
from trl_ext.tasks.doubling.pipeline_options import PipelineOptions
from trl_ext.tasks.doubling.ppo_run import PPORunOptions, WatchOptions, ppo_options, run_ppo, run_record
from trl_ext.tasks.doubling.presets import BACKEND_NAMES, BACKENDS, row_config
from trl_ext.tasks.doubling.report import aggregate_rows, summary_row, text_table, write_report
from trl_ext.tasks.doubling.stages import (
    PretrainConfig,
    RewardConfig,
    RewardModelConfig,
    run_pretrain,
    run_train_reward,
    run_train_reward_model,
)
from trl_ext.tasks.doubling.workers import cores, pretrain_on, worker_pool

DEMO_FILES = ("policy", "reward", "reward_model", "results.json", "report.md", "curves.png")
REWARD_SUFFIX = {"classifier": "", "reward_model": "_rm"}


def _supervised_stage(name: str, stage_cfg, run, fresh: bool, say) -> dict:
    """One supervised stage: its saved result if it finished with these options, else trained now."""

    def train() -> dict:
        say(f"[{name}] training ...")
        return run(stage_cfg)

    return reuse_or_run(
        name, stage_cfg.out, asdict(stage_cfg), train, say, marker="metrics.json", fresh=fresh, writes_marker=True
    )


def _supervised_stages(pipeline: PipelineOptions, out: Path, say, workers) -> dict:
    """The classifier here while the workers import what PPO needs; then the policy's pretraining, data parallel
    over the workers (one torch thread each) when there are any, here when not."""
    fresh, results = pipeline.fresh, {}
    if "classifier" in pipeline.reward_list and not pipeline.reward_url:
        results["reward"] = _supervised_stage(
            "reward",
            RewardConfig(out=str(out / "reward"), seed=0, steps=pipeline.reward_steps),
            run_train_reward,
            fresh,
            say,
        )
    pretrain = run_pretrain if workers is None else partial(pretrain_on, workers, cores(pipeline.jobs))
    results["policy"] = _supervised_stage(
        "policy", PretrainConfig(out=str(out / "policy"), seed=0, steps=pipeline.pretrain_steps), pretrain, fresh, say
    )
    if "reward_model" in pipeline.reward_list:
        # Initialised from the pretrained policy, as InstructGPT initialises its reward model from the
        # SFT model: the policy already computes doublings, so the reward model learns to check them.
        results["reward_model"] = _supervised_stage(
            "reward_model",
            RewardModelConfig(
                out=str(out / "reward_model"), base=str(out / "policy"), seed=0, steps=pipeline.reward_model_steps
            ),
            run_train_reward_model,
            fresh,
            say,
        )
    return results


@dataclass(frozen=True)
class PPORun:
    """One PPO run of the pipeline: a backend, a reward, a seed, and the folder it writes."""

    backend: str
    reward: str
    seed: int
    folder: str

    @property
    def label(self) -> str:
        return self.backend + ("" if self.reward == "classifier" else "+rm")


def row_options(opts: DemoOptions, out: Path, run: PPORun) -> PPORunOptions:
    """A row's ``ppo`` options: the command's, with the row's seed, reward and folder, and its backend's preset
    over the command's defaults and under what the user gave (``presets.row_config``)."""
    reward_dir = out / ("reward" if run.reward == "classifier" else "reward_model")
    train, sources = row_config(replace(opts.train, seed=run.seed), opts.sources, run.backend)
    if run.reward == "reward_model":
        train = replace(train, temperature=opts.pipeline.reward_model_temperature)
    url = opts.pipeline.reward_url
    return ppo_options(
        train,
        policy=str(out / "policy"),
        reward=None if url else str(reward_dir),
        out=str(out / run.folder),
        backend=run.backend,
        watch=opts.watch,
        overwrite=True,
        reward_url=url,
        sources=sources,
    )


def _ppo_stage(opts: DemoOptions, out: Path, run: PPORun, say) -> dict:
    run_opts = row_options(opts, out, run)

    def train() -> dict:
        say(f"[{run.label}] PPO seed {run.seed}: {run_opts.train.total_episodes} episodes ...")
        summary = run_ppo(run_opts, print_fn=say)
        say(summary["summary"])
        return summary

    return reuse_or_run(
        run.label,
        out / run.folder,
        run_record(run_opts),
        train,
        say,
        marker="summary.json",
        fresh=opts.pipeline.fresh,
        writes_marker=True,
    )


def _print_flushed(*args):
    print(*args, flush=True)


def _ppo_stages(opts: DemoOptions, out: Path, runs: list[PPORun], say, workers) -> list[dict]:
    """Every run's summary, in order; on the workers, as many at once as there are, when there are any."""
    if workers is None:
        return [_ppo_stage(opts, out, run, say) for run in runs]
    pending = [workers.apply_async(_ppo_stage, (opts, out, run, _print_flushed)) for run in runs]
    return [p.get() for p in pending]


def _unavailable(backend: str) -> bool:
    """On TRL >= 1.13 the ``trl`` backend cannot run (its row says why instead)."""
    from trl_ext.runs.runners import RUNNERS
    from trl_ext.trl_compat import trl_ppo_available

    return RUNNERS[BACKENDS[backend].runner].needs_trl_ppo and not trl_ppo_available()


def _row_configs(opts: DemoOptions):
    """(backend, the config its row trains with) for every row that can run here, before anything trains."""
    for reward in opts.pipeline.reward_list:
        for backend in opts.pipeline.backend_list:
            if not _unavailable(backend):
                run = PPORun(backend, reward, opts.train.seed, folder="")
                yield backend, row_options(opts, Path(opts.output.out), run).train


def _check_rows(opts: DemoOptions) -> None:
    """Every row's options (its preset's config checks) and its backend's needs, before any stage trains: a row that
    cannot run fails in a second, not after minutes of pretraining."""
    from trl_ext.runs.runners import check_runnable

    for backend, train in _row_configs(opts):
        check_runnable(BACKENDS[backend].runner, train, backend)


def _skipped_as_unavailable(backend: str, label: str, results: dict, rows: list, say) -> bool:
    """On TRL >= 1.13 the ``trl`` backend cannot run: record a row that says why and how to get it."""
    from trl_ext.trl_compat import trl_ppo_unavailable_reason

    if not _unavailable(backend):
        return False
    reason = trl_ppo_unavailable_reason()
    if label not in results["backends"]:
        say(f"[{label}] not run: {reason}")
        results["backends"][label] = {"not_run": reason}
        rows.append({"backend": label, "not_run": reason})
    return True


def _stage_notes(stages: dict) -> list[str]:
    pre = stages["policy"]
    notes = [f"Pretrained policy: value_acc {pre['value_acc']:.3f}, sampled charset spread {pre['charset_spread']}."]
    if "reward" in stages:
        notes.append(f"Reward classifier held-out accuracy: {stages['reward']['heldout_accuracy']:.4f}.")
    if "reward_model" in stages:
        rm = stages["reward_model"]
        notes.append(
            f"Reward model (+rm rows) held-out pairwise accuracy: {rm['heldout_pairwise_accuracy']:.4f} "
            f"({', '.join(f'{k} {v:.3f}' for k, v in rm['heldout_by_kind'].items())})."
        )
    return notes


@dataclass(frozen=True)
class Layout:
    """What tells ``demo`` and ``compare`` apart; they plan, run, collect and write the same way."""

    name: str  # the command, in its headline
    title: str  # report.md's heading
    seeds: int  # PPO runs per backend and reward: --seed, --seed + 1, ...
    folder: str  # a run's folder in --out, from {backend}, {suffix} (the reward's) and {seed}
    aggregate: bool  # a row per label over its seeds (mean ± spread), or the one run's row

    def folders(self, first_seed: int) -> tuple[str, ...]:
        """Every folder a run of this layout may write: what --out may already hold."""
        return tuple(
            self.folder.format(backend=b, suffix=x, seed=first_seed + s)
            for b in BACKEND_NAMES
            for x in REWARD_SUFFIX.values()
            for s in range(self.seeds)
        )


def _plan(opts: DemoOptions, layout: Layout, results: dict, rows: list, say) -> list[PPORun]:
    """Reward x backend x seed, in that order; a backend that cannot run here gets its 'not run' row instead."""
    first, runs = opts.train.seed, []
    for reward in opts.pipeline.reward_list:
        for backend in opts.pipeline.backend_list:
            for seed in range(first, first + layout.seeds):
                folder = layout.folder.format(backend=backend, suffix=REWARD_SUFFIX[reward], seed=seed)
                run = PPORun(backend, reward, seed, folder)
                if not _skipped_as_unavailable(backend, run.label, results, rows, say):
                    runs.append(run)
    return runs


def _collect(layout: Layout, out: Path, runs: list[PPORun], summaries: list[dict], results: dict, rows: list) -> dict:
    """Each label's row (and results entry) from its runs' summaries; the first seed's learning curves."""
    histories, per_label = {}, {}
    for run, summary in zip(runs, summaries):
        per_label.setdefault(run.label, []).append(summary)
        if run.seed == runs[0].seed:
            histories[run.label] = read_history(out / run.folder)
    for label, per_seed in per_label.items():
        if layout.aggregate:
            results["backends"][label] = [summary_row(summary, label) for summary in per_seed]
            rows.append(aggregate_rows(results["backends"][label]))
        else:
            results["backends"][label] = per_seed[0]
            rows.append(summary_row(per_seed[0], label))
    return histories


def _differences(differ: dict[str, tuple]) -> str:
    return ", ".join(f"{name} (ours {ours}, TRL's {theirs})" for name, (ours, theirs) in differ.items())


def group_trainer_notes(opts: DemoOptions) -> list[str]:
    """A line for each row of TRL's critic-free trainers whose preset sets what that trainer fixes otherwise."""
    notes = []
    for backend in opts.pipeline.backend_list:
        runner = BACKENDS[backend].runner
        if runner in ("scratch", "trl"):  # ours fixes nothing; TRL's PPO has the trl/scratch note
            continue
        differ = fixed_differences(runner, row_config(opts.train, opts.sources, backend)[0])
        if differ:
            notes.append(
                f"{backend}: where {trl_trainer(runner)[0]} has no choice it differs from the row's settings in "
                f"{_differences(differ)}."
            )
    return notes


def _notes(opts: DemoOptions, layout: Layout, stages: dict) -> list[str]:
    watch, notes = opts.watch, []
    if layout.aggregate:
        notes += [
            f"Mean ± spread (population std) over {layout.seeds} seed(s); the same pretrained policy, reward "
            "model, prompts in the same order per seed, and episode budget for every row.",
            "Time-to-0.99 columns average the seeds that reached it (see results.json for each seed).",
        ]
    if {"trl", "scratch"} <= set(opts.pipeline.backend_list):
        differ = fixed_differences("trl", opts.train)
        notes.append(
            "trl and scratch: one PPOConfig, every option TRL's PPO has given to it alike; "
            + (
                f"where TRL's PPO has no choice they differ in {_differences(differ)}"
                if differ
                else "nothing else differs"
            )
            + "."
        )
        notes.append(
            f"Episodes to 0.99 are {'each seed' if layout.seeds > 1 else 'one seed'}'s; how many runs "
            "reach it and how fast, over 2 policies x 8 seeds: benchmarks/robustness.py."
        )
    return (
        notes
        + group_trainer_notes(opts)
        + _stage_notes(stages)
        + [
            f"Exact-match on {watch.eval_n} held-out prefix prompts; 'to 0.99' is the first greedy probe "
            f"({watch.probe_n} prompts, every {watch.probe_every} updates) at or above 0.99."
        ]
    )


def run_pipeline(
    opts: DemoOptions, layout: Layout, print_fn=print, worker_setup: Callable[[], None] | None = None
) -> dict:
    """The supervised stages, then every planned PPO run (on workers when --jobs > 1, each running ``worker_setup``
    first), then the rows, ``results.json``, ``report.md`` and ``curves.png``; a finished stage or run is reused."""
    pipeline = opts.pipeline
    if pipeline.reward_url:  # an unreachable server: one line before any stage trains
        from trl_ext.rewards.loading import connect_reward

        connect_reward(pipeline.reward_url)
    _check_rows(opts)
    out = prepare_out_dir(opts.output.out, opts.output.overwrite, owned=DEMO_FILES + layout.folders(opts.train.seed))
    with worker_pool(pipeline.jobs, pipeline.backend_list, worker_setup) as workers:
        results = {
            "config": options_dict(opts),
            "stages": _supervised_stages(pipeline, out, print_fn, workers),
            "backends": {},
        }
        rows = []  # the 'not run' rows first, as planned
        runs = _plan(opts, layout, results, rows, print_fn)
        summaries = _ppo_stages(opts, out, runs, print_fn, workers)
    histories = _collect(layout, out, runs, summaries, results, rows)
    write_report(out, layout.title, rows, histories, results, _notes(opts, layout, results["stages"]))
    print_fn(text_table(rows))
    results["summary"] = (
        f"{layout.name}: results in {out}/results.json, report {out}/report.md, curves {out}/curves.png"
    )
    return results


@dataclass
class DemoOptions(CommandOptions):
    """Everything ``demo`` takes, a part per concern (each part's fields are flags of the command)."""

    train: PPOConfig
    output: OutputOptions
    watch: WatchOptions
    pipeline: PipelineOptions

    def inert_options(self, names) -> dict[str, str]:
        """Of ``names``, those that would change no row (each row's preset and runner decide:
        ``runners.inert_options``); the doubling task has no tools."""
        from trl_ext.runs.runners import inert_options

        inert = [inert_options(BACKENDS[backend].runner, train, names) for backend, train in _row_configs(self)]
        in_every_row = set.intersection(*map(set, inert)) if inert else set()
        # each row's reason, once: rows of different trainers need it for different things
        why = {n: " or, in another row, ".join(dict.fromkeys(row[n] for row in inert)) for n in in_every_row}
        return {**why, **single_turn_inert(names)}
