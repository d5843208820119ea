"""Does ``trl-ext rlhf`` learn on a real chat model with its defaults, without collapsing?

    OMP_NUM_THREADS=1 python benchmarks/rlhf_defaults.py [--updates 40] [--rows ...] [--jobs 2]
    OMP_NUM_THREADS=1 python benchmarks/rlhf_defaults.py --collect WORK_DIR --rows ...   # runs already finished there

Each row runs the recipe as a user would: ``python -m trl_ext rlhf --policy SmolLM2-135M-Instruct`` (bf16, the
recipe's LoRA) with nothing set but the run's size (8 prompts an update, 48-token answers, ``--updates`` updates)
and, for the contrast rows, the settings named in ROWS. Rewards of different kinds:

* ``number``: ``trl_ext.tasks.real_model.task:just_the_number`` on the task's training stream: sparse, in [0, 1],
  verifiable;
* ``positivity``: ``recipes/rlhf/positivity.py:positivity`` on ``recipes/rlhf/explain_prompts.jsonl`` (open
  questions): dense, unbounded, a tone reward whose degenerate optimum is a salad of positive words;
* ``concise``: ``recipes/rlhf/concise.py:concise`` on the same questions: dense, graded, the question's topic named
  in few words, whose degenerate optimum is the topic word alone.

Per row, from the run's metrics.jsonl: the reward's mean over the first and last 5 updates, the KL to the
reference (per answer, summed over tokens), the answer length in tokens, the KL weight at the end, and the last
samples. Writes benchmarks/results/rlhf-defaults-cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "rlhf"
REWARDS = {
    "number": "trl_ext.tasks.real_model.task:just_the_number",
    "positivity": "recipes/rlhf/positivity.py:positivity",
    "concise": "recipes/rlhf/concise.py:concise",
}  # relative: the runs start in the checkout
# name -> (reward, YAML options over the recipe's defaults: what the contrast rows change)
ROWS = {
    "number-defaults": ("number", {}),
    "positivity-defaults": ("positivity", {}),
    # The earlier recipe (lr 1e-5, a fixed KL weight) and that recipe at lr 2e-4: what the defaults are measured
    # against.
    "number-before": (
        "number",
        {"learning_rate": 1e-5, "kl_target": None, "num_ppo_epochs": 4, "value_head_init": "linear"},
    ),
    "positivity-before-lr2e-4": (
        "positivity",
        {"learning_rate": 2e-4, "kl_target": None, "num_ppo_epochs": 4, "value_head_init": "linear"},
    ),
    # What the KL guard alone does: the row above with the defaults' adaptive KL weight.
    "positivity-lr2e-4-guarded": (
        "positivity",
        {"learning_rate": 2e-4, "num_ppo_epochs": 4, "value_head_init": "linear"},
    ),
    "concise-defaults": ("concise", {}),
    "concise-before-lr2e-4": (
        "concise",
        {"learning_rate": 2e-4, "kl_target": None, "num_ppo_epochs": 4, "value_head_init": "linear"},
    ),
    "concise-lr2e-4-guarded": ("concise", {"learning_rate": 2e-4, "num_ppo_epochs": 4, "value_head_init": "linear"}),
    # Issue 40: a user's first run is short, and a linear schedule takes the rate to 0 within it (the recipe's
    # default was linear when these ran; it is constant since, so these rows now match the defaults' schedule).
    "concise-constant-lr": ("concise", {"lr_scheduler_type": "constant"}),
    "number-constant-lr": ("number", {"lr_scheduler_type": "constant"}),
    "positivity-constant-lr": ("positivity", {"lr_scheduler_type": "constant"}),
}
RUN_SIZE = dict(batch_size=8, response_length=48)


def write_prompts(reward: str, n: int, folder: Path) -> Path:
    if reward != "number":
        return RECIPE / "explain_prompts.jsonl"
    from trl_ext.tasks.real_model.task import train_stream

    path = folder / "number_prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in itertools.islice(train_stream(0), n)))
    return path


def mean(values) -> float:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else float("nan")


def summarise(name: str, reward: str, options: dict, out: Path, seconds: float | None) -> dict:
    updates = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())

    def series(key):
        return [u.get(key, float("nan")) for u in updates]

    scores, kl, length = series("objective/scores"), series("objective/kl"), series("val/response_length")
    return {
        "row": name,
        "reward": reward,
        "options": options,
        "updates": len(updates),
        "reward_first5": mean(scores[:5]),
        "reward_last5": mean(scores[-5:]),
        "kl_max": round(max(kl), 3),
        "kl_last5": mean(kl[-5:]),
        "length_first5": mean(length[:5]),
        "length_last5": mean(length[-5:]),
        "length_min": min(length),
        "kl_coef_last": updates[-1].get("objective/kl_coef"),
        "seconds": None if seconds is None else round(seconds, 1),
        "settings_sources": summary.get("sources", {}),
        "samples": summary.get("samples") or [],
        "curve": [
            {"update": i + 1, "reward": round(s, 4), "kl": round(k, 4), "length": round(n, 2)}
            for i, (s, k, n) in enumerate(zip(scores, kl, length))
        ],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of " + ", ".join(ROWS))
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rlhf-defaults-cpu"))
    parser.add_argument(
        "--collect",
        metavar="WORK_DIR",
        help="summarise the --rows runs already finished in WORK_DIR "
        "(a run's folder is named after its row) instead of running them",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from trl_ext.runs.machine import cpu_name
    from trl_ext.tasks.real_model.checkpoint import fetch_smollm2

    names = [n for n in args.rows.split(",") if n]
    if unknown := [n for n in names if n not in ROWS]:
        parser.error(f"unknown rows {unknown}; known: {list(ROWS)}")
    policy = fetch_smollm2()
    work = Path(tempfile.mkdtemp(prefix="rlhf-defaults-"))
    env = dict(
        os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT)
    )

    prompts = {
        reward: write_prompts(reward, args.updates * RUN_SIZE["batch_size"], work)  # once, before the runs
        for reward in {ROWS[n][0] for n in names}
    }

    def one(name):
        reward, options = ROWS[name]
        out, config = work / name, work / f"{name}.yaml"
        config.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in options.items()))  # JSON is YAML
        size = RUN_SIZE["batch_size"]
        cmd = [
            sys.executable,
            "-m",
            "trl_ext",
            "rlhf",
            "--policy",
            str(policy),
            "--reward-fn",
            REWARDS[reward],
            "--prompts",
            str(prompts[reward]),
            "--out",
            str(out),
            "--batch-size",
            str(size),
            "--total-episodes",
            str(args.updates * size),
            "--response-length",
            str(RUN_SIZE["response_length"]),
            "--config",
            str(config),
        ]
        start = time.perf_counter()
        with open(work / f"{name}.log", "w") as log:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
        seconds = time.perf_counter() - start
        print(f"{name}: exit {rc} after {seconds:.0f} s (log {work / name}.log)", flush=True)
        if rc != 0:
            return {"row": name, "failed": rc, "log_tail": (work / f"{name}.log").read_text()[-500:]}
        return summarise(name, reward, options, out, seconds)

    if args.collect:
        rows = [summarise(n, *ROWS[n], Path(args.collect) / n, None) for n in names]
    else:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            rows = list(pool.map(one, names))
    meta = {
        "benchmark": "rlhf-defaults",
        "command": "OMP_NUM_THREADS=1 python benchmarks/rlhf_defaults.py " + " ".join(argv or sys.argv[1:]),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
        "policy": "SmolLM2-135M-Instruct bf16",
        "run_size": dict(RUN_SIZE, updates=args.updates),
        "rows": rows,
    }
    stem = Path(args.out)
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    stem.with_suffix(".md").write_text(results_table(meta, stem.with_suffix(".json").name) + "\n")
    print(f"written {stem}.json/.md")
    return 0 if all("failed" not in r for r in rows) else 1


# How the committed file was made: by two invocations, gathered; a file's JSON holds one invocation's command.
MADE_BY = {
    "rlhf-defaults-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/rlhf_defaults.py`: the number and positivity "
    "rows by one invocation (before the LM-head change; its positivity-lr2e-4-guarded row not run), the concise "
    "rows by another with `--rows concise-defaults,concise-before-lr2e-4,concise-lr2e-4-guarded`, the seven "
    "runs gathered with `--collect` (the file's `command`)"
}


def results_table(data: dict, name: str) -> str:
    """The file's table: each row's reward, KL, answer length and KL weight, first updates against last."""
    m, size = data["machine"], data["run_size"]
    made_by = MADE_BY.get(name) or f"`{data['command']}`"
    lines = [
        f"*Source: [`benchmarks/results/{name}`](../benchmarks/results/{name}), made by {made_by} on "
        f"{m['cpu']} ({m['cores']} cores), one torch thread a run.*",
        "",
        f"`trl-ext rlhf` on {data['policy']}: {size['updates']} updates of {size['batch_size']} prompts, answers "
        f"up to {size['response_length']} tokens, everything else the recipe's defaults except what a row "
        "changes. KL: per answer, summed over its tokens.",
        "",
        "| row | reward | changed from the defaults | reward, first 5 -> last 5 updates | KL max / last 5 | "
        "answer tokens, first 5 -> last 5 (min) | KL weight at the end |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        if "failed" in r:
            lines.append(f"| {r['row']} | failed (exit {r['failed']}) | | | | | |")
            continue
        changed = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "nothing"
        weight = "-" if r["kl_coef_last"] is None else f"{r['kl_coef_last']:,.4f}"
        lines.append(
            f"| {r['row']} | {r['reward']} | {changed} | {r['reward_first5']:.3f} -> {r['reward_last5']:.3f} "
            f"| {r['kl_max']:.2f} / {r['kl_last5']:.2f} | {r['length_first5']:.1f} -> "
            f"{r['length_last5']:.1f} ({r['length_min']:.1f}) | {weight} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
