"""What every benchmark's results table shares: number formats and the source line (the file, the command that
wrote it, the machine). Each benchmark renders its own table with these and writes it beside its JSON
(``benchmarks/results/NAME.md``); ``scripts/gen_docs.py`` pastes the tables into docs/results.md."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _path(name) -> Path:
    """A results file by its name in ``benchmarks/results/``, or by a path (a benchmark's ``--out``)."""
    return RESULTS / name if Path(name).parent == Path(".") else Path(name)


def load(name) -> dict:
    return json.loads(_path(name).read_text())


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def invocation() -> str:
    """This process's command line as a user types it (one torch thread: the benchmarks' setting)."""
    return "`OMP_NUM_THREADS=1 python " + " ".join(shlex.quote(a) for a in [_script(), *sys.argv[1:]]) + "`"


def _script() -> str:
    script = Path(sys.argv[0]).resolve()
    return str(script.relative_to(RESULTS.parents[1])) if script.is_relative_to(RESULTS.parents[1]) else str(script)


def source_line(name, made_by: str) -> str:
    """Where a file's figures come from: the file, ``made_by`` (the command), the machine its JSON records."""
    m, name = load(name).get("machine", {}), Path(name).name
    parts = [
        f"{m['cpu_count']} CPU cores" if "cpu_count" in m else None,
        f"device {m['device']}" if "device" in m else None,
        f"{m['torch_threads']} torch thread{'' if m['torch_threads'] == 1 else 's'} a process"
        if "torch_threads" in m
        else None,
        f"torch {m['torch']}" if "torch" in m else None,
        f"trl {m['trl']}" if "trl" in m else None,
        f"Python {m['python']}" if "python" in m else None,
    ]
    machine = ", ".join(p for p in parts if p)
    return (
        f"*Source: [`benchmarks/results/{name}`](../benchmarks/results/{name}), made by {made_by}; "
        f"{machine or 'machine not recorded'}.*"
    )


def write(name, text: str) -> Path:
    """``benchmarks/results/NAME`` (or the path ``name``) holding ``text``: the table docs/results.md shows."""
    path = _path(name)
    path.write_text(text.rstrip("\n") + "\n")
    return path
