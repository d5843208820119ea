r"""Peak memory of the rlhf recipe with a real vocabulary: how it grows with batch size and vocabulary (CPU).

    OMP_NUM_THREADS=1 python benchmarks/memory_scaling.py --rows 64x64/152k/float32 64x64/152k/bfloat16
        # -> benchmarks/results/memory-scaling-cpu.json; the sweep, one PPO epoch to save time:
    OMP_NUM_THREADS=1 python benchmarks/memory_scaling.py --options "--num-ppo-epochs 1" \
        --out benchmarks/results/memory-scaling-sweep-cpu.json \
        --rows 16x64/152k/float32 64x64/152k/float32 64x64/32k/float32 256x64/152k/float32
    git archive b0d3402 | tar -x -C /tmp/old   # the code before, measured by the same script:
    OMP_NUM_THREADS=1 python benchmarks/memory_scaling.py --code /tmp/old --tag before --options "--num-ppo-epochs 1" \
        --out benchmarks/results/memory-scaling-sweep-cpu.json --rows 16x64/152k/bfloat16 16x64/152k/float32

Each row runs ``trl-ext rlhf`` (the path of ``recipes/rlhf/ppo_rlhf.py``: LoRA, the scratch trainer,
default memory options) in a fresh process on a Qwen2-shaped policy of tiny width (hidden 32, 2 layers)
with a real vocabulary (Qwen's 151,936 or a 32,000 one) and a DeBERTa-v2-shaped reward model (vocabulary
128,100), both saved in the row's dtype; random weights, so responses run to full length. A row is
``BATCHxRESPONSE/VOCAB/DTYPE``; it reports the process's peak resident set (``VmHWM``) and its wall
time. ``--code DIR`` imports trl_ext from DIR instead (an older commit unpacked with ``git archive``),
so the same script measures the code before a change.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCABS = {"32k": 32000, "152k": 151936}
DEFAULT_ROWS = (
    "64x64/152k/float32",
    "64x64/152k/bfloat16",
    "16x64/152k/float32",
    "256x64/152k/float32",
    "64x64/32k/float32",
)

CHILD = r"""
import json, sys, time, torch
sys.path.insert(0, {tests!r})
from tiny_models import tiny_deberta_reward, tiny_qwen2
from trl_ext.commands.cli import main
dtype = getattr(torch, {dtype!r})
policy = tiny_qwen2({root!r} + "/policy", vocab_size={vocab}, dtype=dtype)
reward = tiny_deberta_reward({root!r} + "/reward", vocab_size=128100, dtype=dtype)
start = time.perf_counter()
code = main(["rlhf", "--policy", str(policy), "--reward", str(reward), "--prompts", {prompts!r},
             "--out", {root!r} + "/out", "--batch-size", "{batch}", "--total-episodes", "{episodes}",
             "--response-length", "{response}", *{extra!r}])
seconds = time.perf_counter() - start
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print("RESULT " + json.dumps({{"exit": code, "peak_rss_gb": round(peak / 2**20, 2), "seconds": round(seconds, 1)}}))
"""


def run_row(row: str, code: Path, updates: int, extra: list[str]) -> dict:
    shape, vocab, dtype = row.split("/")
    batch, response = (int(x) for x in shape.split("x"))
    with tempfile.TemporaryDirectory() as root:
        script = CHILD.format(
            tests=str(ROOT / "tests"),
            dtype=dtype,
            root=root,
            vocab=VOCABS[vocab],
            prompts=str(ROOT / "recipes/rlhf/prompts_plain.txt"),
            batch=batch,
            episodes=batch * updates,
            response=response,
            extra=extra,
        )
        env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        start = time.perf_counter()
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=root)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    result = {
        "row": row,
        "batch": batch,
        "response_length": response,
        "vocab": VOCABS[vocab],
        "dtype": dtype,
        "updates": updates,
        "options": extra,
    }
    if run.returncode != 0 or not lines:
        error = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return {**result, "failed": error[:300], "seconds": round(time.perf_counter() - start, 1)}
    return {**result, **json.loads(lines[-1][len("RESULT ") :])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), help="BATCHxRESPONSE/VOCAB/DTYPE")
    parser.add_argument("--updates", type=int, default=1, help="the peak is reached in the first")
    parser.add_argument("--code", default=str(ROOT), help="where trl_ext is imported from")
    parser.add_argument("--tag", default="after", help="the results' key (before/after a change)")
    parser.add_argument(
        "--options",
        default="",
        help="more rlhf options, e.g. '--num-ppo-epochs 1' (peak memory does not depend on it; time does)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "memory-scaling-cpu.json"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from trl_ext.runs.machine import machine

    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {"benchmark": "memory-scaling"}
    results["machine"] = machine()
    rows = results.setdefault(args.tag, {})
    for row in args.rows:
        rows[row] = run_row(row, Path(args.code), args.updates, args.options.split())
        print(json.dumps(rows[row]), flush=True)
        out.write_text(json.dumps(results, indent=2) + "\n")  # after each row: a long sweep keeps what it has
    from benchmarks.tables import invocation, write

    write(out.with_suffix(".md"), results_table(out, invocation()))
    print(f"written {out} and its .md")
    return 0


def results_table(name, made_by: str) -> str:
    """The file's table: each row's peak resident memory and wall time, the code before a change and after."""
    from benchmarks.tables import load, source_line

    data = load(name)
    lines = [
        source_line(name, made_by),
        "",
        "| code | batch x response / vocabulary / checkpoint dtype | PPO epochs | peak RSS GB | wall s |",
        "|---|---|---|---|---|",
    ]
    for tag in ("before", "after"):
        for row in data.get(tag, {}).values():
            options = " ".join(row.get("options", []))
            epochs = (
                "1" if "--num-ppo-epochs 1" in options or "sweep" in Path(name).name else "4"
            )  # the sweep: one epoch
            extra = options.replace("--num-ppo-epochs 1", "").strip()
            peak = (
                f"{row['peak_rss_gb']:.2f}"
                if "peak_rss_gb" in row
                else f"failed: `{row.get('failed', row.get('exit'))}`"
            )
            lines.append(
                f"| {tag} | {row['batch']} x {row['response_length']} / {row['vocab']:,} / {row['dtype']}"
                f"{f' `{extra}`' if extra else ''} | {epochs} | {peak} | {row['seconds']:.1f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
