"""How often the doubling task learns: freshly pretrained policies x seeds x backends, each run a user's command.

    OMP_NUM_THREADS=1 python benchmarks/robustness.py                       # 2 policies x 8 seeds, trl-ext rows
    OMP_NUM_THREADS=1 python benchmarks/robustness.py --rows trl,trl-grpo --seeds 0-3
    python benchmarks/robustness.py --collect                               # the table of runs already finished

A policy ``p`` is ``trl-ext pretrain --seed p`` with its classifier ``trl-ext train-reward --seed p`` (both at their
defaults). Each run is ``trl-ext ppo`` with the row's flags, ``--total-episodes 6400`` (the budget the docs promise)
and a greedy probe of 200 held-out prompts every 5 updates that stops the run once its exact-match reaches 0.99.
A run succeeds when the probe reached 0.99 within the budget; its final greedy exact on the 1,000 held-out prompts
is reported beside it. A failure is named by the character sets it learnt (greedy requested-charset rate >= 0.9
on that prefix's prompts): a run that settles on one or two of the three ends near 0.34 or 0.67.

Writes benchmarks/results/robustness-<device>[-TAG].json and .md; ``--collect`` rebuilds them from the run
folders (rows run in several invocations).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, write_results  # noqa: E402

BUDGET = 6400
# the rows: the flags a user gives `trl-ext ppo` for each trainer at its documented settings for a short run
ROWS = {
    "ppo": ["--backend", "scratch", "--learning-rate", "1e-3"],  # the demo's short-run rate
    "grpo": ["--backend", "scratch", "--advantage-estimator", "grpo", "--num-generations", "4"],
    "rloo": ["--backend", "scratch", "--advantage-estimator", "rloo", "--num-generations", "4"],
    # trl-ext's rloo without its KL loss term (beta), which TRL's RLOO lacks: trl-rloo-matched's like-for-like pair
    "rloo-nobeta": ["--backend", "scratch", "--advantage-estimator", "rloo", "--num-generations", "4", "--beta", "0"],
    "trl": ["--backend", "trl", "--learning-rate", "1e-3"],  # TRL 1.12's PPOTrainer at the demo's settings
    # TRL's GRPOTrainer/RLOOTrainer at trl-ext's grpo/rloo-nobeta settings: 4 generations, 2 epochs x 2 minibatches
    "trl-grpo-matched": ["--backend", "grpo-matched"],
    "trl-rloo-matched": ["--backend", "rloo-matched"],
    # extras: TRL's trainers at the best settings found for them (8 generations, one minibatch)
    "trl-grpo": ["--backend", "grpo-tuned"],
    "trl-rloo": ["--backend", "rloo-tuned"],
}
# Issue 51's critic techniques, each alone on the ppo row (benchmarks/critic_ablation_plan.md, fixed before they ran)
CRITIC_TECHNIQUES = {
    "ppo-value-pretraining": [
        "--critic-warmup-steps",
        "10",
        "--critic-warmup-patience",
        "2",
        "--critic-warmup-lam",
        "1.0",
    ],
    "ppo-decoupled-gae": ["--critic-lam", "1.0"],
    "ppo-length-lambda": ["--lam-length-alpha", "0.05"],
    "ppo-clip-higher": ["--cliprange-high", "0.28"],
    "ppo-positive-lm": ["--positive-lm-coef", "0.1", "--positive-lm-threshold", "0.5"],
    "ppo-gen4": ["--num-generations", "4"],
}
ROWS.update({name: ROWS["ppo"] + flags for name, flags in CRITIC_TECHNIQUES.items()})
# the number task's two winners together (the plan's amendment 2), on this selection set too
ROWS["ppo-combination"] = ROWS["ppo-decoupled-gae"] + CRITIC_TECHNIQUES["ppo-positive-lm"]
TRL_ROWS = {"trl", "trl-grpo", "trl-rloo", "trl-grpo-matched", "trl-rloo-matched"}  # need TRL 1.12 (.venv)
CHARSETS = ("digits", "lower", "upper")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "runs/robustness"))
    parser.add_argument("--policies", default="0,1", help="pretraining seeds, one policy and classifier each")
    parser.add_argument("--seeds", default="0-7", help="PPO seeds: '0-7' or '0,3,5'")
    parser.add_argument("--rows", default="ppo,grpo,rloo", help=f"a comma list of {', '.join(ROWS)}")
    parser.add_argument("--extra", default="", help="flags added to every run (a method change under test)")
    parser.add_argument("--tag", default="", help="suffix of the run folders and the results file")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--collect", action="store_true", help="only gather the runs already finished")
    args = parser.parse_args(argv)
    rows = args.rows.split(",")
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; choose from {', '.join(ROWS)}")
    policies, seeds, out = _ints(args.policies), _ints(args.seeds), Path(args.out)
    extra = args.extra.split()
    runs = [(row, p, s) for p in policies for row in rows for s in seeds]
    if not args.collect:
        started = time.time()
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda p: _stage_pair(out, p), policies))
            failed = [r for r, ok in zip(runs, pool.map(lambda r: _run(out, *r, extra, args.tag), runs)) if not ok]
        print(f"{len(runs) - len(failed)} runs finished, {len(failed)} failed, in {time.time() - started:.0f} s")
    results = [_result(out, row, p, s, args.tag) for row, p, s in runs]
    results = [r for r in results if r is not None]
    _write(results, args, extra)
    return 0


def _ints(text: str) -> list[int]:
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(x) for x in text.split(",")]


def _cli(args: list[str], log: Path) -> bool:
    python = ROOT / ".venv/bin/python"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        code = subprocess.run(
            [str(python if python.exists() else sys.executable), "-m", "trl_ext", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        ).returncode
    if code:
        print(f"FAILED (exit {code}): trl-ext {' '.join(args)}; log {log}")
    return code == 0


def _stage_pair(out: Path, policy: int) -> None:
    """Pretrain policy ``policy`` and its classifier, once (a finished stage is kept)."""
    for stage, name in (("pretrain", "policy"), ("train-reward", "reward")):
        folder = out / f"{name}-{policy}"
        if not (folder / "config.json").exists():
            _cli([stage, "--out", str(folder), "--seed", str(policy)], out / "logs" / f"{name}-{policy}.log")


def _run_dir(out: Path, row: str, policy: int, seed: int, tag: str) -> Path:
    return out / f"{row}{'-' + tag if tag else ''}" / f"policy{policy}-seed{seed}"


def _run(out: Path, row: str, policy: int, seed: int, extra: list[str], tag: str) -> bool:
    folder = _run_dir(out, row, policy, seed, tag)
    if (folder / "summary.json").exists():
        return True
    return _cli(
        [
            "ppo",
            *ROWS[row],
            "--policy",
            str(out / f"policy-{policy}"),
            "--reward",
            str(out / f"reward-{policy}"),
            "--out",
            str(folder),
            "--total-episodes",
            str(BUDGET),
            "--seed",
            str(seed),
            "--probe-every",
            "5",
            "--stop-at-target",
            "true",
            "--overwrite",
            "true",
            *extra,
        ],
        folder.parent / f"{folder.name}.log",
    )


def _result(out: Path, row: str, policy: int, seed: int, tag: str) -> dict | None:
    folder = _run_dir(out, row, policy, seed, tag)
    if not (folder / "summary.json").exists():
        return None
    summary = json.loads((folder / "summary.json").read_text())
    greedy = json.loads((folder / "eval.json").read_text())["greedy"]
    learnt = [c for c in CHARSETS if greedy["per_label"][c]["charset_acc"] >= 0.9]
    reached = summary.get("reached_0_99") or {}
    return {
        "row": row,
        "policy": policy,
        "seed": seed,
        "greedy_exact": greedy["exact"],
        "sampled_exact": summary["sampled"]["exact"],
        "success": bool(reached),
        "episodes_to_0_99": reached.get("episode"),
        "episodes": summary["episodes"],
        "charsets_learnt": learnt,
        "train_seconds": summary["train_seconds"],
    }


def _write(results: list[dict], args, extra: list[str]) -> None:
    from trl_ext.runs.machine import cpu_name, device_tag, machine

    info = machine()
    stem = ROOT / "benchmarks" / "results" / f"robustness-{device_tag(info)}{'-' + args.tag if args.tag else ''}"
    old = json.loads(stem.with_suffix(".json").read_text()) if stem.with_suffix(".json").exists() else {}
    keep = {(r["row"], r["policy"], r["seed"]): r for r in old.get("runs", [])}
    keep.update({(r["row"], r["policy"], r["seed"]): r for r in results})
    runs = sorted(keep.values(), key=lambda r: (list(ROWS).index(r["row"]), r["policy"], r["seed"]))
    summary = _summary(runs)
    command = "OMP_NUM_THREADS=1 python benchmarks/robustness.py " + " ".join(
        a
        for a in (
            f"--rows {args.rows}",
            f"--policies {args.policies}",
            f"--seeds {args.seeds}",
            f"--extra '{args.extra}'" if args.extra else "",
            f"--tag {args.tag}" if args.tag else "",
        )
        if a
    )
    commands = sorted(set(old.get("commands", [])) | {command})
    info["cpu"] = cpu_name() or "unknown"
    json_path = stem.with_suffix(".json")
    write_results(
        json_path,
        {
            "benchmark": "robustness",
            "machine": info,
            "budget_episodes": BUDGET,
            "extra_flags": extra,
            "commands": commands,
            "rows": {r: ROWS[r] for r in summary},
            "summary": summary,
            "runs": runs,
        },
        lambda data: (
            _source(json_path.name, data["commands"], data["machine"]) + "\n\n" + _table(data["summary"], data["runs"])
        ),
    )
    print(stem.with_suffix(".md").read_text())


def _summary(runs: list[dict]) -> dict:
    by_row: dict[str, list[dict]] = {}
    for r in runs:
        by_row.setdefault(r["row"], []).append(r)
    summary = {}
    for row, rs in by_row.items():
        reached = [r["episodes_to_0_99"] for r in rs if r["episodes_to_0_99"] is not None]
        summary[row] = {
            "runs": len(rs),
            "successes": sum(r["success"] for r in rs),
            "success_rate": round(sum(r["success"] for r in rs) / len(rs), 3),
            "median_episodes_to_0_99": statistics.median(reached) if reached else None,
            "failures": [
                f"policy {r['policy']} seed {r['seed']}: {r['greedy_exact']:.3f}, learnt "
                f"{'+'.join(r['charsets_learnt']) or 'none'}"
                for r in rs
                if not r["success"]
            ],
        }
    return summary


def _source(name: str, commands: list[str], m: dict) -> str:
    machine = ", ".join(str(m[k]) for k in ("cpu", "device") if k in m) + (
        f", {m['cpu_count']} cores, torch {m['torch']}, trl {m.get('trl', '-')}" if "cpu_count" in m else ""
    )
    return (
        f"*Source: [`benchmarks/results/{name}`](../benchmarks/results/{name}), made by "
        f"{'; '.join(f'`{c}`' for c in commands) or 'not recorded'}; {machine}.*"
    )


def _episodes(median: float | None) -> str:
    """A median of episode counts as the docs write counts (a median of an even count is a float: 2,560, not 2560.0)."""
    return "-" if median is None else f"{median:,.0f}"


def _table(summary: dict, runs: list[dict]) -> str:
    lines = [
        "| row | runs | reached greedy exact 0.99 | median episodes to 0.99 "
        "| failures (final greedy exact, sets learnt) |",
        "|---|---|---|---|---|",
    ]
    for row, s in summary.items():
        lines.append(
            f"| {row} | {s['runs']} | {s['successes']} ({s['success_rate']:.0%}) | "
            f"{_episodes(s['median_episodes_to_0_99'])} | {'; '.join(s['failures']) or 'none'} |"
        )
    lines += [
        "",
        "| row | policy | seed | greedy exact | sampled exact | episodes to 0.99 | sets learnt | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['row']} | {r['policy']} | {r['seed']} | {r['greedy_exact']:.3f} | {r['sampled_exact']:.3f} | "
            f"{r['episodes_to_0_99'] or '-'} | {'+'.join(r['charsets_learnt']) or 'none'} | "
            f"{r['train_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
