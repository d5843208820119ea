"""What the benchmarks that run rows share: invocation ids and command lines, plans, rows run side by side as
subprocesses, the settings in which two rows differ, and the results JSON written together with its table.

A row is one training run measured in its own process (``run_jobs``); an invocation is one run of a benchmark, and
every row it starts records its id (``new_invocation_id``), so that rows are only ever compared with rows that ran
beside them (``invocation_ratios``). A plan (``read_plan_file``) is committed before it runs: its rows, their
settings, which rows form a pair and which are extras. Each benchmark renders its own table; ``write_results``
writes it beside the JSON it was rendered from.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The virtual environments rows run in: this checkout's, or the folder TRL_EXT_VENVS names (holding .venv and
# .venv-latest: a git worktree has none of its own, a GPU machine has wrappers, benchmarks/gpu_run.sh).
VENVS = Path(os.environ.get("TRL_EXT_VENVS", ROOT))
ABSENT = "<absent>"  # a settings key one row records and the other does not


# ---------------------------------------------------------------------------------------- an invocation


def new_invocation_id() -> str:
    """``YYYYmmddTHHMMSS-xxxxxx``: when the invocation started (ids sort by it) and six random hex digits."""
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def command_line(script: str, argv: list[str] | None) -> str:
    """The benchmark's command as a user types it (one torch thread: the benchmarks' setting); ``argv`` None means
    this process's own arguments; each argument quoted as a shell needs it (a JSON value keeps its quotes)."""
    import shlex
    import sys

    return "OMP_NUM_THREADS=1 " + shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])


def git_commit() -> str | None:
    """The working tree's commit, with ``+changes`` when tracked files differ from it (None outside git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+changes" if dirty else "")) or None


def repository_path(path: str | Path) -> str:
    """``path`` relative to the repository where it lies inside it, else absolute."""
    where = Path(path).resolve()
    return str(where.relative_to(ROOT) if where.is_relative_to(ROOT) else where)


def file_record(path: str | Path) -> dict:
    """Which file a run followed (a plan): its path in the repository and the sha256 of its bytes (None if absent)."""
    path = Path(path)
    return {
        "path": repository_path(path),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None,
    }


# ---------------------------------------------------------------------------------------- plans


class PlanError(ValueError):
    """A plan file that cannot be run as written."""


def read_plan_file(path: str | Path, allowed: set[str], required: set[str]) -> dict:
    """A plan file's JSON with ``path`` and ``sha256`` (of the file's bytes) added; refused when it is not JSON,
    holds a key not in ``allowed`` or lacks one of ``required``. What its keys mean is the benchmark's to check."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        plan = json.loads(raw)
    except json.JSONDecodeError as err:
        raise PlanError(f"{path}: not JSON ({err})") from None
    unknown, missing = set(plan) - allowed, required - set(plan)
    if unknown or missing:
        raise PlanError(f"{path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    return dict(plan, path=str(path), sha256=hashlib.sha256(raw).hexdigest())


def check_seeds(path, seeds) -> None:
    if (
        not seeds
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise PlanError(f"{path}: seeds must be distinct integers, got {seeds!r}")


def check_positive_integers(path, plan: dict, keys) -> None:
    for key in keys:
        if not isinstance(plan[key], int) or plan[key] < 1:
            raise PlanError(f"{path}: {key} must be a positive integer, got {plan[key]!r}")


def check_pairs_and_extras(path, pairs: list[dict], extras: dict, rows) -> None:
    """Every row in exactly one pair (of two rows) or an extra; an extra says why it is not a pair and names the row
    it is compared with."""
    placed = [name for pair in pairs for name in pair["rows"]] + list(extras)
    if any(len(pair.get("rows", [])) != 2 for pair in pairs):
        raise PlanError(f"{path}: each pair names two rows")
    if sorted(placed) != sorted(rows) or len(placed) != len(set(placed)):
        raise PlanError(
            f"{path}: every row must be in exactly one pair or be an extra; rows {sorted(rows)}, "
            f"placed {sorted(placed)}"
        )
    for name, extra in extras.items():
        if extra.get("compare_with") not in rows or not extra.get("about"):
            raise PlanError(f"{path}: extra {name!r} needs 'about' (why it is not a pair) and 'compare_with' (a row)")


def plan_jobs(plan: dict, seeds: list[int], names: list[str] | None = None) -> list[tuple[str, int]]:
    """``(row, seed)`` in the order they start: seed by seed, each pair's two rows one after the other (with two
    jobs they start together, and each row of a pair runs beside one other row throughout), then the extras."""
    chosen = set(names or plan["rows"])
    order = [name for pair in plan["pairs"] for name in pair["rows"]] + list(plan["extras"])
    return [(name, seed) for seed in seeds for name in order if name in chosen]


# ---------------------------------------------------------------------------------------- rows side by side


def row_environment() -> dict:
    """A row's process environment: one thread for every math library, this repository importable."""
    return dict(
        os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT)
    )


def launch_row(cmd: list[str], log: Path) -> int:
    """Run one row's subprocess, its output into ``log``; its exit code. (Tests replace it.)"""
    with open(log, "w") as handle:
        return subprocess.run(cmd, env=row_environment(), stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT).returncode


def run_jobs(jobs: list[tuple[str, int]], workers: int, command_of, logs: Path, on_done=None) -> list:
    """Each ``(row, seed)`` job as a subprocess (``command_of(row, seed, out) -> argv``), ``workers`` at a time, in
    the order given; ``[(row dict or None, failure or None)]`` in that order. Each row gets ``wall``: when it started
    and ended, seconds after the first job started, and at the end ``alone``: the seconds no other row ran beside it.
    ``on_done(results so far)`` after each."""
    start, lock, done = time.perf_counter(), threading.Lock(), {}

    def one(job):
        name, seed = job
        out = logs / f"{name}-{seed}.json"
        t0 = time.perf_counter()
        rc = launch_row(command_of(name, seed, out), logs / f"{name}-{seed}.log")
        t1 = time.perf_counter()
        print(f"{name} seed {seed}: exit {rc} after {t1 - t0:.0f} s (log {logs}/{name}-{seed}.log)", flush=True)
        if rc == 0 and out.exists():
            row = json.loads(out.read_text())
            row["wall"] = {"started": round(t0 - start, 1), "ended": round(t1 - start, 1)}
            result = (row, None)
        else:
            tail = (logs / f"{name}-{seed}.log").read_text().strip().splitlines()[-1:] or [""]
            result = (None, {"trainer": name, "seed": seed, "returncode": rc, "error": tail[0][-300:]})
        with lock:
            done[job] = result
            if on_done is not None:
                on_done([done[j] for j in jobs if j in done])
        return result

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(one, jobs))
    walls = [r["wall"] for r, _ in results if r]
    for wall in walls:  # seconds it ran with no other row beside it: a lighter load (the end of an invocation)
        wall["alone"] = round(alone_seconds(wall, [w for w in walls if w is not wall]), 1)
    return results


def alone_seconds(wall: dict, others: list[dict]) -> float:
    """How long ``[started, ended]`` was covered by none of ``others``' intervals."""
    edges = sorted(
        {
            wall["started"],
            wall["ended"],
            *(t for w in others for t in (w["started"], w["ended"]) if wall["started"] < t < wall["ended"]),
        }
    )
    return sum(
        b - a for a, b in zip(edges, edges[1:]) if not any(w["started"] <= a and b <= w["ended"] for w in others)
    )


@contextmanager
def evaluating(policy):
    """Score ``policy`` in the middle of training, leaving the random state and train mode as they were (TRL's
    trainers sample from torch's global generator: an evaluation must not change their run)."""
    import torch

    cpu, cuda = torch.random.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    training = policy.training
    policy.eval()
    try:
        yield policy
    finally:
        policy.train(training)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


# ---------------------------------------------------------------------------------------- comparing rows


def settings_differences(a: dict, b: dict) -> dict:
    """``{key: [a's value, b's value]}`` for every key whose values differ (a key one side lacks: ``<absent>``)."""
    return {
        k: [a.get(k, ABSENT), b.get(k, ABSENT)] for k in sorted(set(a) | set(b)) if a.get(k, ABSENT) != b.get(k, ABSENT)
    }


def ground(row: dict) -> tuple:
    """Where a row ran: its task and seed (rows of one task and seed compare with each other)."""
    return row.get("task"), row["seed"]


def ground_order(place: tuple) -> tuple:
    """Grounds in order: by task (None where a row names none), then seed."""
    return str(place[0]), place[1]


def invocation_ratios(rows: list[dict], a: str, b: str) -> list[dict]:
    """Per invocation, ``a``'s mean seconds per update over ``b``'s, from that invocation's rows only and over the
    grounds (task and seed) where both ran: a ratio is never taken across invocations or seed sets. Rows without an
    invocation id are left out."""
    found = []
    one_task = len({r.get("task") for r in rows}) <= 1
    for invocation in dict.fromkeys(r.get("invocation") for r in rows):
        if invocation is None:
            continue
        mine = {
            name: {
                ground(r): r["seconds_per_update"]
                for r in rows
                if r["trainer"] == name and r.get("invocation") == invocation
            }
            for name in (a, b)
        }
        both = sorted(set(mine[a]) & set(mine[b]), key=ground_order)
        if not both:
            continue
        # like for like: a ground one side lacks (a row that failed) is in neither mean
        mean = {name: sum(v[place] for place in both) / len(both) for name, v in mine.items()}
        found.append(
            {
                "invocation": invocation,
                "seconds_per_update": {k: round(v, 2) for k, v in mean.items()},
                "ratio": round(mean[a] / mean[b], 3),
                "seeds": {name: sorted({seed for _, seed in v}) for name, v in mine.items()},  # each side ran
                "averaged": [seed if one_task else f"{task}:{seed}" for task, seed in both],  # the means' grounds
                "per_seed": {
                    (str(seed) if one_task else f"{task}:{seed}"): round(
                        mine[a][(task, seed)] / mine[b][(task, seed)], 3
                    )
                    for task, seed in both
                },
            }
        )
    return found


def comparisons(rows: list[dict], plan: dict) -> list[dict]:
    """Per pair (and per extra beside the row it is compared with): the settings keys in which the two rows
    differ, computed from what the rows recorded, seed for seed, beside the keys the plan declares; and the
    ratio of their seconds per update in each invocation."""
    by = {(r["trainer"], r["seed"]): r for r in rows}
    entries = [
        (pair["rows"][0], pair["rows"][1], "pair", pair.get("about", ""), pair.get("differs_in", []))
        for pair in plan["pairs"]
    ]
    entries += [
        (name, extra["compare_with"], "extra", extra["about"], extra.get("differs_in", []))
        for name, extra in plan["extras"].items()
    ]
    found = []
    for a, b, kind, about, declared in entries:
        seeds = sorted(s for (name, s) in by if name == a and (b, s) in by)
        differ = {}
        for seed in seeds:
            for key, values in settings_differences(by[a, seed]["settings"], by[b, seed]["settings"]).items():
                differ.setdefault(key, values)
        found.append(
            {
                "rows": [a, b],
                "kind": kind,
                "about": about,
                "seeds": seeds,
                "differing_settings": differ,
                "declared": sorted(declared),
                "as_declared": sorted(differ) == sorted(declared) if seeds else None,
                "invocations": invocation_ratios(rows, a, b),
            }
        )
    return found


# ---------------------------------------------------------------------------------------- results


def invocations_of(result: dict) -> list[str]:
    """The invocations a result holds: one run's id, a merged result's list, none before ids were kept."""
    return result.get("invocations") or ([result["invocation"]] if "invocation" in result else [])


def merge_invocations(results: list[dict], command: str, shared, identity, same=lambda value: value) -> dict:
    """One result from several invocations of one run's settings (a judgement longer than a session): their rows,
    failures, commands, plans and wall seconds together, each row keeping its invocation. Refused where a ``shared``
    key differs (compared through ``same``) or where two rows have one ``identity``. A row that failed in one
    invocation and was measured in another keeps its failure as the rerun's cause. A merged result merges again."""
    first = results[0]
    for other in results[1:]:
        differ = [key for key in shared if same(other.get(key)) != same(first.get(key))]
        if differ:
            raise ValueError(f"the results differ in {differ}: not one run's invocations")
    seen = [identity(r) for result in results for r in result["rows"]]
    twice = sorted({job for job in seen if seen.count(job) > 1})
    measured = set(seen)
    if twice:
        raise ValueError(f"rows measured twice: {twice}")
    failed = [f for result in results for f in result.get("failed", []) + result.get("reruns", [])]
    per_invocation = ("command", "commands", "invocation", "invocations", "wall_seconds", "plan", "plans", "jobs")
    merged = {key: first[key] for key in first if key not in per_invocation}
    merged.update(
        command=command,
        commands=[c for result in results for c in result.get("commands") or [result["command"]]],
        invocations=[i for result in results for i in invocations_of(result)],
        rows=[r for result in results for r in result["rows"]],
        failed=[f for f in failed if identity(f) not in measured],
        reruns=[f for f in failed if identity(f) in measured],
        wall_seconds=[w for result in results for w in as_list(result.get("wall_seconds"))],
        jobs={i: j for result in results for i, j in per_invocation_value(result, "jobs").items()},
        plans={
            i: plan
            for result in results
            for i, plan in (
                result.get("plans") or {i: result["plan"] for i in invocations_of(result) if "plan" in result}
            ).items()
        },
    )
    return merged


def per_invocation_value(result: dict, key: str) -> dict:
    """A setting each invocation ran with (``jobs``), by invocation: a merged result keeps a dict of them."""
    value = result.get(key)
    return value if isinstance(value, dict) else {i: value for i in invocations_of(result)}


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def write_results(json_path: Path, data: dict, render, indent: int | None = 2) -> dict:
    """``json_path`` holding ``data`` and beside it the ``.md`` table ``render(data)`` makes of the JSON as written
    (so that a table rewritten later from the file is the same); the data read back. ``indent`` None: one line (a
    file of every update of many runs stays small)."""
    json_path = Path(json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=indent, ensure_ascii=False) + "\n")
    written = json.loads(json_path.read_text())
    json_path.with_suffix(".md").write_text(render(written).rstrip("\n") + "\n")
    return written


def rewrite_table(json_path: Path, render) -> None:
    """The ``.md`` table beside ``json_path`` again, from the file (a benchmark's ``--table``)."""
    json_path = Path(json_path)
    json_path.with_suffix(".md").write_text(render(json.loads(json_path.read_text())).rstrip("\n") + "\n")
