"""``trl-ext demo`` and ``trl-ext compare``: the whole doubling pipeline, both PPO backends side by side.

Each stage writes into its own folder of ``--out`` and finishes by writing its marker file
(``metrics.json`` or ``summary.json``); a later run reuses every finished stage whose options
did not change, so an interrupted demo resumes where it stopped. Nothing is ever deleted.
"""

from __future__ import annotations

import json
import platform
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trl_ext.commands.outputs import OutputOptions, prepare_out_dir
from trl_ext.commands.parsing import Command, CommandResult, options_dict
from trl_ext.commands.ppo import BACKENDS, DOUBLING_DEFAULTS, WatchOptions, ppo_options, run_ppo
from trl_ext.commands.stages import PretrainConfig, RewardConfig, run_pretrain, run_train_reward
from trl_ext.options import field
from trl_ext.ppo.config import PPOConfig

DEMO_FILES = ("policy", "reward", "results.json", "report.md", "curves.png")


@dataclass
class PipelineOptions:
    """Which stages and backends the pipeline runs, and whether it may reuse finished stages."""

    backends: str = field("trl,scratch", help=f"comma-separated, from {', '.join(BACKENDS)}")
    pretrain_steps: int = field(PretrainConfig.steps, help="policy pretraining steps")
    reward_steps: int = field(RewardConfig.steps, help="reward classifier training steps")
    fresh: bool = field(False, help="rebuild every stage even where finished results exist")

    def __post_init__(self):
        unknown = [b for b in self.backend_list if b not in BACKENDS]
        if not self.backend_list or unknown:
            raise ValueError(f"unknown backend(s) {unknown or self.backends!r}: choose from {', '.join(BACKENDS)}")

    @property
    def backend_list(self) -> list[str]:
        return [b.strip() for b in self.backends.split(",") if b.strip()]


@dataclass
class SeedOptions:
    seeds: int = field(3, help="PPO seeds per backend (seed, seed+1, ...)")

    def __post_init__(self):
        if self.seeds <= 0:
            raise ValueError(f"seeds must be positive, got {self.seeds}")


def _finished(path: Path, marker: str, config: dict) -> dict | None:
    """The stage's saved result if it finished with these options, else None."""
    file = path / marker
    if not file.exists():
        return None
    result = json.loads(file.read_text())
    return result if result.get("config") == config else None


def _supervised_stages(pipeline: PipelineOptions, out: Path, say) -> dict:
    results = {}
    stages = (("policy", PretrainConfig(out=str(out / "policy"), seed=0, steps=pipeline.pretrain_steps), run_pretrain),
              ("reward", RewardConfig(out=str(out / "reward"), seed=0, steps=pipeline.reward_steps), run_train_reward))
    for name, stage_cfg, run in stages:
        done = None if pipeline.fresh else _finished(out / name, "metrics.json", asdict(stage_cfg))
        if done is not None:
            say(f"[{name}] reusing {out / name}")
            results[name] = done
        else:
            say(f"[{name}] training ...")
            results[name] = run(stage_cfg)
    return results


def _ppo_stage(opts, out: Path, backend: str, seed: int, folder: str, say) -> dict:
    run_opts = ppo_options(replace(opts.train, seed=seed), policy=str(out / "policy"), reward=str(out / "reward"),
                           out=str(out / folder), backend=backend, watch=opts.watch, overwrite=True)
    done = None if opts.pipeline.fresh else _finished(out / folder, "summary.json", options_dict(run_opts))
    if done is not None:
        say(f"[{backend}] reusing {out / folder}")
        return done
    say(f"[{backend}] PPO seed {seed}: {opts.train.total_episodes} episodes ...")
    summary = run_ppo(run_opts, print_fn=say)
    say(summary["summary"])
    return summary


def _skipped_as_unavailable(backend: str, results: dict, rows: list, say) -> bool:
    """On TRL >= 1.13 the ``trl`` backend cannot run: record a row that says why and how to get it."""
    from trl_ext.trl_compat import trl_ppo_available, trl_ppo_unavailable_reason

    if backend != "trl" or trl_ppo_available():
        return False
    reason = trl_ppo_unavailable_reason()
    say(f"[{backend}] not run: {reason}")
    results["backends"][backend] = {"not_run": reason}
    rows.append({"backend": backend, "not_run": reason})
    return True


def _row(summary: dict) -> dict:
    reached = summary.get("reached_0_99") or {}
    return {
        "backend": summary["backend"],
        "greedy_exact": summary["greedy"]["exact"],
        "sampled_exact": summary["sampled"]["exact"],
        "greedy_charset": summary["greedy"]["charset_acc"],
        "episodes_to_target": reached.get("episode"),
        "seconds_to_target": reached.get("train_seconds"),
        "episodes_per_second": summary["episodes_per_second"],
        "train_seconds": summary["train_seconds"],
        "final_kl": summary["final_kl"],
        "episodes": summary["episodes"],
    }


def _history(path: Path) -> list[dict]:
    file = path / "metrics.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def machine() -> dict:
    import os

    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    try:
        import trl

        info["trl"] = trl.__version__
    except ImportError:  # pragma: no cover
        pass
    return info


def _write_outputs(out: Path, title: str, rows: list[dict], histories: dict, results: dict, notes: list[str]) -> None:
    from trl_ext.commands.report import markdown_table, plot_curves

    results["rows"] = rows
    results["machine"] = machine()
    (out / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    plot_curves(histories, out / "curves.png")
    lines = [f"# {title}", "", markdown_table(rows), "", "![learning curves](curves.png)", "", *notes]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def run_demo(opts, print_fn=print) -> dict:
    from trl_ext.commands.report import text_table

    watch = opts.watch
    out = prepare_out_dir(opts.output.out, opts.output.overwrite,
                          owned=DEMO_FILES + tuple(f"ppo_{b}" for b in BACKENDS))
    results = {"config": options_dict(opts), "stages": _supervised_stages(opts.pipeline, out, print_fn),
               "backends": {}}
    rows, histories = [], {}
    for backend in opts.pipeline.backend_list:
        if _skipped_as_unavailable(backend, results, rows, print_fn):
            continue
        summary = _ppo_stage(opts, out, backend, opts.train.seed, f"ppo_{backend}", print_fn)
        results["backends"][backend] = summary
        rows.append(_row(summary))
        histories[backend] = _history(out / f"ppo_{backend}")
    pre = results["stages"]["policy"]
    notes = [f"Pretrained policy: value_acc {pre['value_acc']:.3f}, sampled charset spread {pre['charset_spread']}.",
             f"Reward classifier held-out accuracy: {results['stages']['reward']['heldout_accuracy']:.4f}.",
             f"Exact-match on {watch.eval_n} held-out prefix prompts; 'to 0.99' is the first greedy probe "
             f"({watch.probe_n} prompts, every {watch.probe_every} updates) at or above 0.99."]
    _write_outputs(out, "trl-ext demo: the doubling task", rows, histories, results, notes)
    table = text_table(rows)
    print_fn(table)
    results["summary"] = f"demo: results in {out}/results.json, report {out}/report.md, curves {out}/curves.png"
    return results


def _aggregate(rows: list[dict]) -> dict:
    merged = {"backend": rows[0]["backend"]}
    for key in rows[0]:
        if key == "backend":
            continue
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        merged[key] = {"mean": statistics.fmean(values) if values else None,
                       "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
                       "n": len(values), "of": len(rows)}
    return merged


def run_compare(opts, print_fn=print) -> dict:
    from trl_ext.commands.report import text_table

    first, seeds = opts.train.seed, opts.seeds.seeds
    folders = tuple(f"{b}_seed{first + s}" for b in BACKENDS for s in range(seeds))
    out = prepare_out_dir(opts.output.out, opts.output.overwrite, owned=DEMO_FILES + folders)
    results = {"config": options_dict(opts), "stages": _supervised_stages(opts.pipeline, out, print_fn),
               "backends": {}}
    rows, histories = [], {}
    for backend in opts.pipeline.backend_list:
        if _skipped_as_unavailable(backend, results, rows, print_fn):
            continue
        per_seed = []
        for s in range(seeds):
            seed = first + s
            summary = _ppo_stage(opts, out, backend, seed, f"{backend}_seed{seed}", print_fn)
            per_seed.append(_row(summary))
            if s == 0:
                histories[backend] = _history(out / f"{backend}_seed{seed}")
        results["backends"][backend] = per_seed
        rows.append(_aggregate(per_seed))
    notes = [f"Mean ± spread (population std) over {seeds} seed(s); the same pretrained policy, reward model, "
             "prompts in the same order per seed, and episode budget for every row.",
             "Time-to-0.99 columns average the seeds that reached it (see results.json for each seed)."]
    _write_outputs(out, "trl-ext compare: PPO backends (and TRL GRPO/RLOO) on the doubling task", rows, histories,
                   results, notes)
    print_fn(text_table(rows))
    results["summary"] = f"compare: results in {out}/results.json, report {out}/report.md"
    return results


def demo_command(opts) -> CommandResult:
    results = run_demo(opts)
    return CommandResult(results["summary"], results)


def compare_command(opts) -> CommandResult:
    results = run_compare(opts)
    return CommandResult(results["summary"], results)


_PIPELINE_PARTS = {"train": PPOConfig, "output": OutputOptions, "watch": WatchOptions, "pipeline": PipelineOptions}
# The demo's PPO budget: 100 updates of 64 (greedy 0.99 comes by about update 50-75); compare runs 19,200.
DEMO = Command(help="the whole pipeline end to end, both backends", parts=_PIPELINE_PARTS, run=demo_command,
               defaults={**DOUBLING_DEFAULTS, "out": "demo_out", "total_episodes": 6400})
COMPARE = Command(help="both backends side by side over seeds", parts={**_PIPELINE_PARTS, "seeds": SeedOptions},
                  run=compare_command, defaults={**DOUBLING_DEFAULTS, "out": "compare_out"})
