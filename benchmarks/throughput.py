"""PPO throughput of both backends, side by side, identical settings, one run.

    OMP_NUM_THREADS=1 python benchmarks/throughput.py --policy runs/policy --reward runs/reward
    python benchmarks/throughput.py --build   # pretrain a policy and classifier first (into runs/bench)

Measures episodes/s and tokens/s (prompt + response tokens of the rollouts, counted where both
backends hand them to the reward function) over
``--updates`` updates after ``--warmup`` untimed ones, and writes JSON with the machine described
to ``benchmarks/results/throughput-<device>.json``. ``--advantage-estimators gae,grpo`` also times the scratch
trainer without a critic (row ``scratch-grpo``, 8 completions a prompt): no value head, critic pass or value
loss; each row gives its trainable parameters (what Adam keeps two more copies of).

    OMP_NUM_THREADS=1 python benchmarks/throughput.py --backends scratch --separate-critic \
        --advantage-estimators gae,grpo,rloo --out benchmarks/results/throughput-cpu-critic-free.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(
    backend: str, cfg, policy_dir: str, reward_dir: str, updates: int, warmup: int, estimator: str = "gae"
) -> dict:
    from dataclasses import replace

    import torch

    from trl_ext.commands.ppo import DOUBLING_DEFAULTS
    from trl_ext.ppo.config import PPOConfig
    from trl_ext.runs.run import train_options
    from trl_ext.tasks.doubling.ppo_run import load_inputs, ppo_options
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    if estimator != "gae":  # a critic-free estimator needs groups of completions of one prompt
        cfg = {**cfg, "advantage_estimator": estimator, "num_generations": 8}
    run = ppo_options(PPOConfig(**{**DOUBLING_DEFAULTS, **cfg}), policy_dir, reward_dir, out="unused", backend=backend)
    policy, tokenizer, inner_reward = load_inputs(run)
    seen_tokens: list[int] = []

    def reward_fn(prompts, completions, **columns):
        # Both backends pass every rollout through the reward: count its tokens there, the same way.
        seen_tokens.append(
            sum(len(tokenizer(p + c, add_special_tokens=False)["input_ids"]) for p, c in zip(prompts, completions))
        )
        return inner_reward(prompts, completions, **columns)

    reward_fn.__name__ = inner_reward.__name__
    total = (updates + warmup) * run.train.batch_size
    run_cfg = replace(train_options(run), total_episodes=total)
    dataset = ppo_prompt_dataset(tokenizer, total, run.train.seed)
    stamps: list[float] = []
    tokens: list[int] = []

    def tick(update: int, stats: dict) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        tokens.append(seen_tokens[-1])

    if backend == "scratch":
        from trl_ext.ppo.trainer import PPOTrainer

        trainer = PPOTrainer(policy, reward_fn, args=run_cfg, train_dataset=dataset, processing_class=tokenizer)
        trainer.train(lambda u, s: tick(u, s))
        trained = trainer.model
    else:
        import tempfile

        from transformers import TrainerCallback

        from trl_ext.trl_compat.backend import build_trl_trainer

        class _Tick(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "objective/scores" in logs:
                    tick(state.global_step, logs)

        with tempfile.TemporaryDirectory() as tmp:
            trainer = build_trl_trainer(run_cfg, policy, tokenizer, reward_fn, dataset, tmp, callbacks=[_Tick()])
            trainer.train()
            trained = trainer.model
    timed = stamps[warmup:]
    seconds = timed[-1] - stamps[warmup - 1] if warmup else timed[-1] - timed[0]
    count = len(timed) if warmup else len(timed) - 1
    return {
        "backend": backend if estimator == "gae" else f"{backend}-{estimator}",
        "updates_timed": count,
        "trainable_parameters": sum(p.numel() for p in trained.parameters() if p.requires_grad),
        "seconds": round(seconds, 3),
        "seconds_per_update": round(seconds / count, 4),
        "episodes_per_second": round(count * run.train.batch_size / seconds, 2),
        "tokens_per_second": round(sum(tokens[warmup:][-count:]) / seconds, 1),
    }


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default=str(ROOT / "runs/bench/policy"))
    parser.add_argument("--reward", default=str(ROOT / "runs/bench/reward"))
    parser.add_argument("--build", action="store_true", help="pretrain policy and reward first")
    parser.add_argument("--backends", default="trl,scratch")
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-ppo-epochs", type=int, default=4)
    parser.add_argument("--num-mini-batches", type=int, default=1)
    parser.add_argument("--separate-critic", action="store_true")
    parser.add_argument(
        "--advantage-estimators",
        default="gae",
        help="the scratch trainer's estimators to time (gae: PPO's critic; grpo, rloo: none)",
    )
    parser.add_argument("--out", default=None, help="JSON file (default benchmarks/results/throughput-<device>.json)")
    args = parser.parse_args(argv)

    from trl_ext.runs.machine import device_tag, machine

    if args.build:
        from trl_ext.commands.stages import PretrainConfig, RewardConfig, run_pretrain, run_train_reward

        run_pretrain(PretrainConfig(out=args.policy))
        run_train_reward(RewardConfig(out=args.reward))
    cfg = {
        "batch_size": args.batch_size,
        "num_ppo_epochs": args.num_ppo_epochs,
        "num_mini_batches": args.num_mini_batches,
        "separate_critic": args.separate_critic,
    }
    rows = [
        measure(b.strip(), cfg, args.policy, args.reward, args.updates, args.warmup, estimator)
        for b in args.backends.split(",")
        for estimator in (args.advantage_estimators.split(",") if b.strip() == "scratch" else ["gae"])
    ]
    info = machine()
    result = {
        "benchmark": "ppo-throughput",
        "settings": {
            **cfg,
            "updates": args.updates,
            "warmup": args.warmup,
            "advantage_estimators": args.advantage_estimators,
        },
        "machine": info,
        "rows": rows,
    }
    by = {r["backend"]: r for r in rows}
    if "trl" in by and "scratch" in by:
        result["scratch_over_trl_episodes_per_second"] = round(
            by["scratch"]["episodes_per_second"] / by["trl"]["episodes_per_second"], 2
        )
    device = device_tag(info)
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"throughput-{device}.json"
    for r in rows:
        print(
            f"{r['backend']:12s} {r['episodes_per_second']:8.1f} episodes/s {r['tokens_per_second']:9.1f} tokens/s "
            f"({r['seconds_per_update']:.3f} s/update, {r['trainable_parameters']:,} trainable parameters)"
        )
    if "scratch_over_trl_episodes_per_second" in result:
        print(f"scratch / trl episodes per second: {result['scratch_over_trl_episodes_per_second']}x")
    from benchmarks.harness import write_results
    from benchmarks.tables import invocation

    write_results(out, result, lambda _written: results_table(out, invocation()))
    print(f"written {out} and its .md")
    return 0


def results_table(name, made_by: str) -> str:
    """The file's table: each row's episodes and tokens a second, seconds an update and trainable parameters."""
    from benchmarks.tables import fmt, load, source_line

    data = load(name)
    s = data["settings"]
    settings = (
        f"batch {s['batch_size']}, {s['num_ppo_epochs']} epochs, {s['num_mini_batches']} minibatch"
        f"{'es' if s['num_mini_batches'] != 1 else ''}, {s['updates']} timed updates after {s['warmup']} "
        f"warm-ups; value model: {'separate critic' if s.get('separate_critic') else 'shared backbone'}"
    )
    lines = [
        source_line(name, made_by) + f" {settings[0].upper() + settings[1:]}.",
        "",
        "| row | episodes/s | tokens/s | seconds an update | trainable parameters |",
        "|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        lines.append(
            f"| `{row['backend']}` | {row['episodes_per_second']:.1f} | {row['tokens_per_second']:,.0f} | "
            f"{row['seconds_per_update']:.3f} | {fmt(row.get('trainable_parameters'))} |"
        )
    if "scratch_over_trl_episodes_per_second" in data:
        lines += ["", f"scratch / trl episodes a second: {data['scratch_over_trl_episodes_per_second']:.2f}x."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
