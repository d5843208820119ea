"""What the reward-model rows need to reach sampled exact >= 0.99: the centring term and the rollout temperature.

    OMP_NUM_THREADS=1 python benchmarks/rm_ablation.py      # about 25 minutes on 2 CPU cores

Trains two scalar reward models on the doubling preferences from one pretrained policy (the
``RewardModelConfig`` defaults, 4,800 steps; one with TRL's centring term at 0.01, our default, one
without it), then runs PPO with both backends (``trl-ext ppo``, default budget of 19,200 episodes,
seed 0, two runs at a time, one torch thread each) with each reward model at rollout temperature 1.0 and 1.2, evaluated
on 1,000 held-out prefix prompts at temperature 1 (greedy and sampled). Writes
benchmarks/results/rm-ablation-<device>.json and .md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CENTRING = {"centred": 0.01, "plain": 0.0}
TEMPERATURES = (1.0, 1.2)


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "runs/rm_ablation"))
    parser.add_argument("--backends", default="scratch,trl", help="comma-separated PPO backends (scratch, trl)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    from trl_ext.runs.machine import device_tag, machine

    policy = out / "policy"
    _run_all([[_cli(), "pretrain", "--out", str(policy)]] if not (policy / "metrics.json").exists() else [])
    _run_all(
        [
            [
                _cli(),
                "train-reward-model",
                "--base",
                str(policy),
                "--out",
                str(out / f"rm_{name}"),
                "--center-rewards-coefficient",
                str(coefficient),
            ]
            for name, coefficient in CENTRING.items()
            if not (out / f"rm_{name}" / "metrics.json").exists()
        ]
    )
    runs = list(itertools.product(args.backends.split(","), CENTRING, TEMPERATURES))
    folder = {r: out / f"{r[0]}_{r[1]}_t{r[2]}" for r in runs}
    _run_all(
        [
            [
                _cli(),
                "ppo",
                "--backend",
                b,
                "--policy",
                str(policy),
                "--reward",
                str(out / f"rm_{c}"),
                "--temperature",
                str(t),
                "--seed",
                str(args.seed),
                "--out",
                str(folder[(b, c, t)]),
                "--overwrite",
            ]
            for (b, c, t) in runs
            if not (folder[(b, c, t)] / "eval.json").exists()
        ]
    )

    reward_models = {}
    for name in CENTRING:
        metrics = json.loads((out / f"rm_{name}" / "metrics.json").read_text())
        reward_models[name] = {
            "pairwise": metrics["heldout_pairwise_accuracy"],
            "wrong_value": metrics["heldout_by_kind"]["wrong_value"],
            "chosen_std": metrics["heldout_scores"]["chosen"]["std"],
            "score_gap": round(
                metrics["heldout_scores"]["chosen"]["mean"] - metrics["heldout_scores"]["rejected"]["mean"], 3
            ),
        }
    rows = []
    for backend, centring, temperature in runs:
        report = json.loads((folder[(backend, centring, temperature)] / "eval.json").read_text())
        rows.append(
            {
                "backend": backend,
                "reward_model": centring,
                "temperature": temperature,
                "greedy_exact": report["greedy"]["exact"],
                "sampled_exact": report["sampled"]["exact"],
                "sampled_value_acc": report["sampled"]["value_acc"],
                "sampled_charset_acc": report["sampled"]["charset_acc"],
            }
        )
    info = machine()
    device = device_tag(info)
    stem = ROOT / "benchmarks" / "results" / f"rm-ablation-{device}"
    stem.with_suffix(".json").write_text(
        json.dumps(
            {
                "benchmark": "rm_ablation",
                "machine": info,
                "seed": args.seed,
                "reward_models": reward_models,
                "runs": rows,
            },
            indent=2,
        )
        + "\n"
    )
    from benchmarks.tables import invocation, write

    print(write(stem.with_suffix(".md"), results_table(stem.with_suffix(".json"), invocation())).read_text())
    print(f"written {stem}.json and {stem}.md")
    return 0


def _cli() -> str:
    return str(Path(sys.executable).parent / "trl-ext")


def _run_all(commands: list[list[str]], jobs: int = 2) -> None:
    """Run the commands two at a time, one torch thread each; stop at the first failure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pending = list(commands)
    while pending:
        batch, pending = pending[:jobs], pending[jobs:]
        procs = [
            subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for c in batch
        ]
        for command, proc in zip(batch, procs):
            _, err = proc.communicate()
            if proc.returncode:
                raise SystemExit(f"failed ({proc.returncode}): {' '.join(command)}\n{err[-3000:]}")


def results_table(name, made_by: str) -> str:
    """The file's tables: each reward model's held-out figures, then each PPO run's accuracies."""
    from benchmarks.tables import load, source_line

    data = load(name)
    reward_models, rows = data["reward_models"], data["runs"]
    lines = [
        source_line(name, made_by) + f" Seed {data.get('seed', 0)}, one run per cell.",
        "",
        "| reward model | held-out pairwise | wrong value | right answers' score std | mean score gap |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {rm} | {m['pairwise']:.3f} | {m['wrong_value']:.3f} | {m['chosen_std']:.3f} | {m['score_gap']:.3f} |"
        for rm, m in reward_models.items()
    ]
    lines += [
        "",
        "| backend | reward model | rollout temperature | greedy exact | sampled exact | sampled value | "
        "sampled charset |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['backend']} | {r['reward_model']} | {r['temperature']} | {r['greedy_exact']:.3f} | "
        f"{r['sampled_exact']:.3f} | {r['sampled_value_acc']:.3f} | {r['sampled_charset_acc']:.3f} |"
        for r in rows
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
