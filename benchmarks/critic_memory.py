"""What a critic of its own costs on a real model (issue 51's target: the critic as a second LoRA adapter within 1.1x
of the shared value head's peak memory, where a separate critic copies the backbone).

    OMP_NUM_THREADS=1 python benchmarks/critic_memory.py        # writes benchmarks/results/critic-memory-cpu.json

SmolLM2-135M-Instruct (the catalogue's, or ``--model FOLDER``), LoRA r=16 on every linear layer, trl-ext's PPO
(critic and GAE) at the public-tasks benchmark's settings (benchmarks/public_tasks.py: `basic_arithmetic` at its easy
config, the last-number answer format, 16 rollouts of up to 32 tokens), ``--updates`` updates, each critic in a fresh
process, one after the other:

* ``shared head``: the value head on the policy's own (LoRA-adapted) backbone, the default;
* ``separate critic``: ``separate_critic=True``, the value head on a copy of the backbone, trained whole;
* ``critic adapter``: ``critic_adapter=True``, the value head on a second LoRA adapter of the same frozen base.

Recorded per row: peak resident set (``ru_maxrss``, MiB), seconds per update, trainable parameters, the reward per
update; and each row's peak against the shared head's.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, command_line, git_commit, new_invocation_id, run_jobs, write_results  # noqa: E402

CRITICS = {
    "shared head": {},
    "separate critic": {"separate_critic": True},
    "critic adapter": {"critic_adapter": True},
}
TASK = "basic_arithmetic"
SETTINGS = dict(response_length=32, batch_size=16, updates=3, seed=0)


def run_row(name: str, model: str, updates: int, out: Path) -> None:
    """One critic's row in this process: build, train ``updates`` updates, write the row."""
    import torch
    from peft import LoraConfig

    from benchmarks import public_tasks
    from trl_ext.ppo.config import PPOConfig
    from trl_ext.rewards.reasoning_gym import ReasoningGymReward
    from trl_ext.runs.runners import RUNNERS, RunInputs

    torch.set_num_threads(1)
    policy, tokenizer = public_tasks.load(model)
    policy.train()
    config = PPOConfig(
        output_dir=tempfile.mkdtemp(prefix="critic-memory-"),
        total_episodes=updates * SETTINGS["batch_size"],
        seed=SETTINGS["seed"],
        advantage_estimator="gae",
        **dict(public_tasks.SETTINGS, response_length=SETTINGS["response_length"], batch_size=SETTINGS["batch_size"]),
        **CRITICS[name],
    )
    spec = dict(task=TASK, system_prompt="default", task_config=public_tasks.EASY[TASK], answer_format="last-number")
    inputs = RunInputs(
        config,
        policy,
        tokenizer,
        ReasoningGymReward(),
        prompts=lambda n: public_tasks.prompt_dataset(tokenizer, spec, n, SETTINGS["seed"]),
        peft_config=LoraConfig(task_type="CAUSAL_LM", **public_tasks.LORA),
    )
    runner = RUNNERS["scratch"](inputs)
    curve, start = [], time.perf_counter()

    def on_update(update, stats) -> bool:
        curve.append({"update": int(update), "reward": round(float(stats["objective/scores"]), 4)})
        return False

    runner.train(on_update)
    seconds = time.perf_counter() - start
    trainable = sum(p.numel() for p in runner.trainer.actor_critic.parameters() if p.requires_grad)
    row = {
        "critic": name,
        "task": TASK,
        "trainer": "ppo",
        "estimator": "gae",
        "seed": SETTINGS["seed"],
        "settings": {
            **public_tasks.SETTINGS,
            **SETTINGS,
            "updates": updates,
            **CRITICS[name],
            "lora": public_tasks.LORA,
        },
        "after": None,  # a memory row: no evaluation
        "updates": len(curve),
        "seconds_per_update": round(seconds / max(1, len(curve)), 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "trainable_parameters": trainable,
        "curve": curve,
        "torch": torch.__version__,
    }
    out.write_text(json.dumps(row, indent=2) + "\n")


def results_table(data: dict, json_name: str) -> str:
    from benchmarks.tables import cell, fmt

    s = data["settings"]
    lines = [
        f"*Source: [`benchmarks/results/{json_name}`](../benchmarks/results/{json_name}), made by "
        f"`{data['command']}`; {data['machine'].get('cpu_count', '?')} CPU cores, device {data['machine']['device']}, "
        f"torch {data['machine'].get('torch', '?')}.* {cell(data['model'])}, LoRA r=16, `{TASK}` (easy, last-number), "
        f"{s['batch_size']} rollouts of up to {s['response_length']} tokens, {s['updates']} updates, each critic in a "
        "fresh process, one after the other.",
        "",
        "| critic | peak RSS MiB | x the shared head's | trainable parameters | s/update | invocation |",
        "|---|---:|---:|---:|---:|---|",
    ]
    base = next((r["peak_rss_mib"] for r in data["rows"] if r["critic"] == "shared head"), None)
    for r in data["rows"]:
        ratio = r["peak_rss_mib"] / base if base else None
        lines.append(
            f"| {r['critic']} | {fmt(r['peak_rss_mib'], 0)} | {fmt(ratio, 2)} | {r['trainable_parameters']:,} | "
            f"{fmt(r['seconds_per_update'], 1)} | {r['invocation']} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="a catalogue name or a checkpoint folder")
    parser.add_argument("--updates", type=int, default=SETTINGS["updates"])
    parser.add_argument("--out", help="results file (default benchmarks/results/critic-memory-<device>.json)")
    parser.add_argument("--row", choices=list(CRITICS), help=argparse.SUPPRESS)  # the child's job
    parser.add_argument("--row-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:
        run_row(args.row, args.model, args.updates, Path(args.row_out))
        return 0
    from benchmarks.public_tasks import model_label
    from trl_ext.runs.machine import device_tag, machine

    info = machine()
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"critic-memory-{device_tag(info)}.json"
    invocation = new_invocation_id()
    data = {
        "benchmark": "critic-memory",
        "command": command_line("benchmarks/critic_memory.py", argv),
        "invocation": invocation,
        "commit": git_commit(),
        "machine": info,
        "model": model_label(args.model),
        "settings": {**SETTINGS, "updates": args.updates},
        "rows": [],
        "failed": [],
    }
    passed = ["--model", args.model, "--updates", str(args.updates)]
    names = {name.replace(" ", "-"): name for name in CRITICS}

    def command_of(job: str, seed: int, row_out: Path) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), *passed, "--row", names[job], "--row-out", str(row_out)]

    results = run_jobs([(job, SETTINGS["seed"]) for job in names], 1, command_of, Path(tempfile.mkdtemp()))
    data["rows"] = [dict(row, invocation=invocation) for row, _ in results if row]
    data["failed"] = [failure for _, failure in results if failure]
    write_results(out, data, lambda written: results_table(written, out.name))
    print(f"written {out} and its .md")
    return 0 if not data["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
