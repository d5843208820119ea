"""The LM head over the last positions: HF's int ``logits_to_keep`` against indices (``rollout.last_positions``).

    OMP_NUM_THREADS=1 python benchmarks/lm_head_slice.py

With an int, HF hands the head ``hidden[:, -K:, :]``, a view whose rows are not contiguous; torch's matmul then
does not fold it into one matrix product and multiplies it by the head through a batched copy of the ``(V, H)``
weight, one per row. Indices gather a contiguous ``(B, K, H)`` copy first. Shapes: SmolLM2-135M's head (49,152 x 576)
and Qwen2's vocabulary (151,936) at SmolLM2's width, 16 rows of 90 positions, the last 13 kept (an update of the
real-model benchmark) and the last 1 (a sampler's prefill); with and without gradients to the hidden states;
bf16 and float32. Each figure is the median of 3 timed calls after one untimed. Writes
benchmarks/results/lm-head-slice-cpu.{json,md}.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
ROWS, LENGTH, HIDDEN, REPEATS = 16, 90, 576, 3
VOCABS = {"SmolLM2 (49,152)": 49152, "Qwen2 (151,936)": 151936}


def median_seconds(call) -> float:
    call()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(vocab: int, kept: int, dtype: torch.dtype, grad: bool) -> dict:
    sys.path.insert(0, str(ROOT))
    from trl_ext.ppo.rollout.loop import last_positions

    head = torch.randn(vocab, HIDDEN, dtype=dtype)
    hidden = torch.randn(ROWS, LENGTH, HIDDEN, dtype=dtype, requires_grad=grad)
    index = last_positions(LENGTH, kept)
    with torch.set_grad_enabled(grad):
        by_int = median_seconds(lambda: torch.nn.functional.linear(hidden[:, -kept:, :], head))
        by_index = median_seconds(lambda: torch.nn.functional.linear(hidden[:, index, :], head))
    return {
        "int_seconds": round(by_int, 5),
        "index_seconds": round(by_index, 5),
        "slower_by": round(by_int / by_index, 1),
    }


def main() -> int:
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    from trl_ext.runs.machine import cpu_name

    rows = []
    for name, vocab in VOCABS.items():
        for dtype in (torch.bfloat16, torch.float32):
            for kept in (13, 1):
                for grad in (False, True):
                    rows.append(
                        {
                            "head": name,
                            "vocab": vocab,
                            "dtype": str(dtype).removeprefix("torch."),
                            "kept": kept,
                            "grad": grad,
                            **measure(vocab, kept, dtype, grad),
                        }
                    )
                    print(rows[-1], flush=True)
    out = ROOT / "benchmarks" / "results" / "lm-head-slice-cpu"
    meta = {
        "benchmark": "lm-head-slice",
        "command": "OMP_NUM_THREADS=1 python benchmarks/lm_head_slice.py",
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform()},
        "torch": torch.__version__,
        "rows_positions_hidden": [ROWS, LENGTH, HIDDEN],
        "repeats": REPEATS,
    }
    out.with_suffix(".json").write_text(json.dumps(dict(meta, rows=rows), indent=2) + "\n")
    out.with_suffix(".md").write_text(results_table(dict(meta, rows=rows), out.with_suffix(".json").name) + "\n")
    print(f"written {out}.json/.md")
    return 0


def results_table(data: dict, name: str) -> str:
    """The file's table: the head's seconds with an int ``logits_to_keep`` and with indices, each shape."""
    m = data["machine"]
    rows, positions, hidden = data["rows_positions_hidden"]
    lines = [
        f"*Source: [`benchmarks/results/{name}`](../benchmarks/results/{name}), made by `{data['command']}` on "
        f"{m['cpu']} ({m['cores']} cores), one torch thread a process.*",
        "",
        f"torch {data['torch']}: the head over the last positions of {rows} rows of {positions} positions (hidden "
        f"{hidden}), the median of {data['repeats']} calls each.",
        "",
        "| head | dtype | positions kept | gradients | int `logits_to_keep` s | indices s | int slower by |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['head']} | {r['dtype']} | {r['kept']} | {'yes' if r['grad'] else 'no'} | {r['int_seconds']:.3f} | "
        f"{r['index_seconds']:.3f} | {r['slower_by']:.0f}x |"
        for r in data["rows"]
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
