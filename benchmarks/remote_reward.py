"""Rewards over the network: a load test of ``trl-ext serve-reward`` and the share of a doubling ``ppo``
run's wall time that scoring through it takes.

    OMP_NUM_THREADS=1 python benchmarks/remote_reward.py --policy runs/policy --reward runs/reward
    python benchmarks/remote_reward.py --build   # pretrain a policy and classifier first (into runs/bench)

1. Load test: ``serve-reward --reward DIR`` (the doubling charset classifier, one reward call at a time)
   in its own process on loopback; ``--clients`` threads, each with its own ``RemoteReward``, send
   ``--requests`` requests of ``--rows`` completions each, back to back. Latency percentiles, requests/s,
   failed requests. The same again with a rule reward (``doubling_exact``), whose scoring costs nearly
   nothing: what the standard library's server itself costs.
2. PPO: the scratch trainer at the ``ppo`` command's defaults (batch 64, 4 epochs, separate critic) for
   ``--updates`` updates after ``--warmup``, rewarded by the classifier in-process, then through the
   server; the trainer's own ``timing/reward`` against the wall time of the updates.

Writes ``benchmarks/results/remote-reward-<device>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def serve(args: list[str]):
    """``trl-ext serve-reward ARGS --port 0`` in a child process, and the address it printed when ready."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trl_ext.commands.cli", "serve-reward", *args, "--port", "0", "--device", "cpu"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    line = proc.stdout.readline()
    if "ready at" not in line:
        proc.kill()
        raise SystemExit(f"serve-reward did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[-1].strip()


def rows_of(n: int, seed: int) -> tuple[list[str], list[str], list[int]]:
    """Doubling prompts with their expected answers, every fourth one wrong (scores of both signs)."""
    import random

    from trl_ext.tasks.doubling.task import expected_answer, parse_prompt, ppo_prompt_dataset
    from trl_ext.tasks.doubling.tokenizer import build_tokenizer

    data = ppo_prompt_dataset(build_tokenizer(), n, seed)
    rng = random.Random(seed)
    completions = []
    for prompt, label in zip(data["prompt"], data["label"]):
        answer = expected_answer(parse_prompt(prompt).question, label)
        completions.append((answer if rng.random() > 0.25 else answer[::-1]) + "E")
    return list(data["prompt"]), completions, list(data["label"])


def load_test(url: str, clients: int, requests_each: int, rows: int) -> dict:
    from trl_ext.rewards import RemoteReward

    prompts, completions, labels = rows_of(rows, seed=0)
    latencies: list[float] = []
    failures: list[str] = []
    retries = [0]
    lock = threading.Lock()

    def client():
        remote = RemoteReward(url, batch_size=rows)
        mine, failed = [], []
        for _ in range(requests_each):
            start = time.perf_counter()
            try:
                remote(prompts, completions, label=labels)
            except Exception as err:  # noqa: BLE001 - counted, not raised: the test reports them
                failed.append(str(err))
                continue
            mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)
            failures.extend(failed)
            retries[0] += remote.retries

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ordered = sorted(latencies)

    def pct(p):
        return round(1000 * ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 2) if ordered else None

    return {
        "clients": clients,
        "requests_per_client": requests_each,
        "rows_per_request": rows,
        "requests": clients * requests_each,
        "failed": len(failures),
        "first_failure": failures[:1],
        "retries": retries[0],
        "wall_seconds": round(wall, 2),
        "requests_per_second": round(len(latencies) / wall, 1),
        "completions_per_second": round(len(latencies) * rows / wall, 1),
        "latency_ms": {
            "p50": pct(50),
            "p90": pct(90),
            "p99": pct(99),
            "max": pct(100),
            "mean": round(1000 * statistics.fmean(ordered), 2) if ordered else None,
        },
    }


def ppo_share(policy_dir: str, reward_dir: str, url: str | None, updates: int, warmup: int) -> dict:
    """Wall time of ``updates`` PPO updates and the trainer's ``timing/reward`` within them."""
    from dataclasses import replace

    from trl_ext.commands.ppo import DOUBLING_DEFAULTS
    from trl_ext.ppo.config import PPOConfig
    from trl_ext.ppo.trainer import PPOTrainer
    from trl_ext.runs.run import train_options
    from trl_ext.tasks.doubling.ppo_run import load_inputs, ppo_options
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    run = ppo_options(
        PPOConfig(**DOUBLING_DEFAULTS), policy_dir, None if url else reward_dir, out="unused", reward_url=url
    )
    policy, tokenizer, reward = load_inputs(run)
    total = (updates + warmup) * run.train.batch_size
    cfg = replace(train_options(run), total_episodes=total)
    trainer = PPOTrainer(
        policy,
        reward,
        args=cfg,
        train_dataset=ppo_prompt_dataset(tokenizer, total, cfg.seed),
        processing_class=tokenizer,
    )
    stamps = []
    history = trainer.train(lambda update, stats: stamps.append(time.perf_counter()))
    timed = history[warmup:]
    wall = stamps[-1] - stamps[warmup - 1]
    reward_seconds = sum(h["timing/reward"] for h in timed)
    return {
        "reward": "remote" if url else "local",
        "updates": updates,
        "warmup": warmup,
        "batch_size": cfg.batch_size,
        "wall_seconds": round(wall, 2),
        "reward_seconds": round(reward_seconds, 3),
        "reward_share": round(reward_seconds / wall, 4),
        "reward_ms_per_update": round(1000 * reward_seconds / updates, 1),
        "final_scores": timed[-1]["objective/scores"],
    }


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default=str(ROOT / "runs/bench/policy"))
    parser.add_argument("--reward", default=str(ROOT / "runs/bench/reward"))
    parser.add_argument("--build", action="store_true", help="pretrain policy and reward first")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200, help="requests per client")
    parser.add_argument("--rows", type=int, default=64, help="completions per request")
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--out", default=None, help="JSON file (default benchmarks/results/remote-reward-<device>.json)"
    )
    args = parser.parse_args(argv)

    from trl_ext.runs.machine import device_tag, machine

    if args.build:
        from trl_ext.commands.stages import PretrainConfig, RewardConfig, run_pretrain, run_train_reward

        run_pretrain(PretrainConfig(out=args.policy))
        run_train_reward(RewardConfig(out=args.reward))
    result = {
        "benchmark": "remote-reward",
        "machine": machine(),
        "server": "http.server.ThreadingHTTPServer, max_concurrency 1, in its own process on loopback",
        "load": {},
        "ppo": [],
    }
    import tempfile

    rule = Path(tempfile.mkdtemp()) / "rule_reward.py"
    rule.write_text("from trl_ext.tasks.doubling.rewards import ExactMatch\n\nexact = ExactMatch()\n")
    for name, serve_args in (("classifier", ["--reward", args.reward]), ("rule", ["--reward-fn", f"{rule}:exact"])):
        proc, url = serve(serve_args)
        try:
            result["load"][name] = row = load_test(url, args.clients, args.requests, args.rows)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        print(
            f"load[{name}]: {row['requests']} requests of {args.rows}, {row['failed']} failed, "
            f"{row['requests_per_second']} req/s, latency ms {row['latency_ms']}"
        )
    proc, url = serve(["--reward", args.reward])
    try:
        for remote_url in (None, url):
            row = ppo_share(args.policy, args.reward, remote_url, args.updates, args.warmup)
            result["ppo"].append(row)
            print(
                f"ppo[{row['reward']}]: {row['wall_seconds']} s for {args.updates} updates, reward "
                f"{row['reward_ms_per_update']} ms/update = {100 * row['reward_share']:.1f}% of wall time"
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    local, remote = result["ppo"]
    result["remote_reward_share"] = remote["reward_share"]
    result["remote_minus_local_ms_per_update"] = round(
        remote["reward_ms_per_update"] - local["reward_ms_per_update"], 1
    )
    result["same_final_scores"] = local["final_scores"] == remote["final_scores"]
    out = (
        Path(args.out)
        if args.out
        else ROOT / "benchmarks" / "results" / f"remote-reward-{device_tag(result['machine'])}.json"
    )
    from benchmarks.harness import write_results
    from benchmarks.tables import invocation

    write_results(out, result, lambda _written: results_table(out, invocation()))
    print(f"written {out} and its .md")
    return 0


def results_table(name, made_by: str) -> str:
    """The file's tables: the server under load, then PPO with the reward scored in process and through it."""
    from benchmarks.tables import fmt, load, source_line

    data = load(name)
    lines = [
        source_line(name, made_by) + f" Server: {data.get('server', '?')}.",
        "",
        "| load test | requests | failed | requests/s | completions/s | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for reward, load_test in data["load"].items():
        lat = load_test["latency_ms"]
        lines.append(
            f"| {reward} reward, {load_test['clients']} clients x {load_test['requests_per_client']} requests "
            f"x {load_test['rows_per_request']} completions | {load_test['requests']:,} | {load_test['failed']} "
            f"| {load_test['requests_per_second']:.1f} | {load_test['completions_per_second']:,.0f} | "
            f"{lat['p50']:.0f} | {lat['p99']:.0f} | {lat['max']:.0f} |"
        )
    lines += [
        "",
        "| PPO run, reward scored | updates timed | batch | wall s | reward s | reward share of wall time |"
        " final scores |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in data["ppo"]:
        lines.append(
            f"| {run['reward']} | {run['updates']} (after {run['warmup']}) | {run['batch_size']} | "
            f"{run['wall_seconds']:.2f} | {run['reward_seconds']:.3f} | {run['reward_share']:.1%} | "
            f"{run['final_scores']:.4f} |"
        )
    lines += ["", f"Same final scores in-process and through the server: {fmt(data.get('same_final_scores'))}."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
