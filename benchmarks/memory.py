"""Resident memory of the scratch trainer over many updates (it must stay flat).

    OMP_NUM_THREADS=1 python benchmarks/memory.py --policy runs/bench/policy --reward runs/bench/reward

Runs ``--updates`` updates (default 1,000, batch 16 to keep it to a few minutes), reads the
process's resident set size every ``--every`` updates from /proc, and writes JSON to
benchmarks/results/memory-<device>.json: the samples, and the growth from the first sample
after warm-up to the last.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default=str(ROOT / "runs/bench/policy"))
    parser.add_argument("--reward", default=str(ROOT / "runs/bench/reward"))
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--every", type=int, default=50)
    args = parser.parse_args(argv)

    from trl_ext.commands.ppo import DOUBLING_DEFAULTS
    from trl_ext.ppo.config import PPOConfig
    from trl_ext.ppo.trainer import PPOTrainer
    from trl_ext.runs.machine import machine
    from trl_ext.runs.run import train_options
    from trl_ext.tasks.doubling.ppo_run import load_inputs, ppo_options
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    train = PPOConfig(**DOUBLING_DEFAULTS, batch_size=args.batch_size, total_episodes=args.updates * args.batch_size)
    run = ppo_options(train, args.policy, args.reward, out="unused")
    policy, tokenizer, reward_fn = load_inputs(run)
    trainer = PPOTrainer(
        policy,
        reward_fn,
        args=train_options(run),
        processing_class=tokenizer,
        train_dataset=ppo_prompt_dataset(tokenizer, train.total_episodes, 0),
    )
    samples = []

    def sample(update: int, stats: dict) -> None:
        if update % args.every == 0:
            gc.collect()  # measure what is really held, not garbage awaiting collection
            samples.append({"update": update, "rss_mb": round(rss_mb(), 1)})
            print(samples[-1], flush=True)

    trainer.train(sample)
    warm = samples[1] if len(samples) > 1 else samples[0]
    # Model directories as given, relative to the repository when inside it: no machine's temp paths.
    settings = {
        k: (
            os.path.relpath(v, ROOT)
            if k in ("policy", "reward") and Path(v).resolve().is_relative_to(ROOT)
            else Path(v).name
            if k in ("policy", "reward")
            else v
        )
        for k, v in vars(args).items()
    }
    result = {
        "benchmark": "ppo-memory",
        "machine": machine(),
        "settings": settings,
        "samples": samples,
        "growth_mb_after_warmup": round(samples[-1]["rss_mb"] - warm["rss_mb"], 1),
    }
    out = ROOT / "benchmarks" / "results" / f"memory-{'cpu' if result['machine']['device'] == 'cpu' else 'gpu'}.json"
    from benchmarks.harness import write_results
    from benchmarks.tables import invocation

    write_results(out, result, lambda _written: results_table(out, invocation()))
    print(f"growth after warm-up: {result['growth_mb_after_warmup']} MB; written {out} and its .md")
    return 0


def results_table(name, made_by: str) -> str:
    """The file's figures: resident memory at warm-up and at the end."""
    from benchmarks.tables import load, source_line

    data = load(name)
    samples, s = data["samples"], data["settings"]
    return "\n".join(
        [
            source_line(name, made_by),
            "",
            f"{s['updates']:,} scratch updates at batch {s['batch_size']}: resident memory "
            f"{samples[0]['rss_mb']} MB at "
            f"update {samples[0]['update']}, {samples[-1]['rss_mb']} MB at update {samples[-1]['update']} "
            f"(growth after warm-up: {data['growth_mb_after_warmup']} MB).",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
