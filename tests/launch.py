"""Launching 2-process tests: a free rendezvous port for each, so that the two test runs of
`scripts/test.sh` (side by side) never collide on torchrun's default port; and the two-rank harnesses of
tests/scripts (two_ranks.py), run and read back."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_port_args() -> list[str]:
    return ["--main_process_port", str(free_port())]


def torchrun_port_args() -> list[str]:
    return ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]


def run_two_ranks(script: str, *args: str, **env: str) -> list[dict]:
    """Run ``tests/scripts/<script>`` on 2 CPU ranks (torchrun) and return the ranks' JSON lines, rank 0 first,
    checked to come from ranks 0 and 1 of 2 that agree on the trained weights (bit for bit) and the scores."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        *torchrun_port_args(),
        str(ROOT / "tests/scripts" / script),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **env}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    ranks = sorted(
        (json.loads(line) for line in re.findall(r"\{.*?\}", run.stdout)),  # lines may run together
        key=lambda r: r["rank"],
    )
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)], run.stdout[-2000:]
    assert ranks[0]["weights"] == ranks[1]["weights"]  # the ranks agree
    assert ranks[0]["scores"] == ranks[1]["scores"]
    return ranks
