"""The critic's health on a long ground: the doubling task for 100 updates, each run a user's ``trl-ext ppo``.

    OMP_NUM_THREADS=1 python benchmarks/critic_health_doubling.py --plan benchmarks/plans/critic-health-doubling.json

A plan (``benchmarks/plans/critic-health-*.json``) names the pretraining seed of the policy and its classifier
(``trl-ext pretrain`` and ``train-reward``, made once), the episodes, the seeds, the flags every row shares and each
row's own. Each run is ``python -m trl_ext ppo`` with them, no early stop; its ``metrics.jsonl`` gives the curve
(score and the critic's health each update, ``trl_ext.ppo.critic_health``) and its ``summary.json`` the greedy and
sampled exact on the held-out prompts after training. Writes ``benchmarks/results/<plan name>-cpu.json`` and the
``.md`` beside it: the health table (``critic_health_table``) and every run's row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.critic_health_table import health_table  # noqa: E402
from benchmarks.harness import ROOT, git_commit, write_results  # noqa: E402

CURVE = {  # curve key -> metrics.jsonl key
    "reward": "objective/scores",
    "explained_variance": "val/explained_variance",
    "explained_variance_pooled": "val/explained_variance_pooled",
    "returns_var": "val/returns_var",
    "first_value_return_corr": "val/first_value_return_corr",
    "value_loss": "loss/value_avg",
}


def trl_ext(args: list[str], log: Path) -> None:
    """``python -m trl_ext ARGS`` from this checkout (one torch thread), its output in ``log``; raises on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("w") as f:
        code = subprocess.run(
            [sys.executable, "-m", "trl_ext", *args], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
    if code.returncode:
        raise RuntimeError(f"trl-ext {' '.join(args)} failed (exit {code.returncode}); log {log}")


def run_row(plan: dict, work: Path, row: str, seed: int) -> dict:
    """One run: its curve, its held-out exact after training and its seconds."""
    folder = work / row / f"seed{seed}"
    if not (folder / "summary.json").exists():
        policy, reward = work / "policy", work / "reward"
        flags = [*plan["common"], *plan["rows"][row], "--policy", str(policy), "--reward", str(reward)]
        flags += ["--out", str(folder), "--total-episodes", str(plan["episodes"]), "--seed", str(seed)]
        trl_ext(["ppo", *flags], work / "logs" / f"{row}-{seed}.log")
    summary = json.loads((folder / "summary.json").read_text())
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [
        {"update": i, **{key: round(float(m[name]), 4) for key, name in CURVE.items() if name in m}}
        for i, m in enumerate(lines, start=1)
    ]
    return {
        "trainer": row,
        "seed": seed,
        "flags": [*plan["common"], *plan["rows"][row]],
        "episodes": summary["episodes"],
        "after": summary["greedy"]["exact"],
        "after_sampled": summary["sampled"]["exact"],
        "train_seconds": summary["train_seconds"],
        "curve": curve,
    }


def render(data: dict) -> str:
    lines = [
        f"*Source: [`benchmarks/results/{data['name']}.json`](../benchmarks/results/{data['name']}.json), made by "
        f"`{data['command']}` at commit {data['commit']}, one torch thread a run, {data['jobs']} at a time.*",
        "",
        f"The doubling task, {data['episodes']:,} episodes a run; score: greedy exact on the 1,000 held-out prompts.",
        "",
        *health_table(data),
        "| row | seed | greedy exact after | sampled exact after | train seconds |",
        "|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['trainer']} | {r['seed']} | {r['after']:.3f} | {r['after_sampled']:.3f} | {r['train_seconds']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument(
        "--work", default="/tmp/critic-health-doubling", help="the runs' folders (kept: a rerun resumes)"
    )
    args = parser.parse_args(argv)
    plan = json.loads(Path(args.plan).read_text())
    work = Path(args.work)
    for stage, name in (("pretrain", "policy"), ("train-reward", "reward")):
        if not (work / name / "config.json").exists():
            trl_ext(
                [stage, "--out", str(work / name), "--seed", str(plan["policy_seed"])], work / "logs" / f"{name}.log"
            )
    runs = [(row, seed) for seed in plan["seeds"] for row in plan["rows"]]
    with ThreadPoolExecutor(plan["jobs"]) as pool:
        rows = list(pool.map(lambda rs: run_row(plan, work, *rs), runs))
    data = {
        "benchmark": "critic-health-doubling",
        "name": f"{plan['name']}-cpu",
        "command": f"OMP_NUM_THREADS=1 python benchmarks/critic_health_doubling.py --plan {args.plan}",
        "commit": git_commit(),
        "plan": plan,
        "episodes": plan["episodes"],
        "jobs": plan["jobs"],
        "rows": rows,
    }
    write_results(ROOT / "benchmarks" / "results" / f"{plan['name']}-cpu.json", data, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
