"""A finished stage is reused while what it ran with is unchanged.

A stage writes its marker file last (``stage.json``; the doubling stages' ``metrics.json``, a PPO run's
``summary.json``), holding the ``config`` it ran with: its options and, where it read files, their fingerprints.
A later run reuses the folder when that config is the same, so an interrupted pipeline resumes where it stopped;
a changed option or input runs the stage again. Nothing is ever deleted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

STAGE_MARKER = "stage.json"


def fingerprint(*paths) -> list:
    """What a stage read: a data file by its content, a model directory by its files' sizes and times."""
    import hashlib

    prints = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            prints.append(
                sorted([p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in path.iterdir() if p.is_file())
            )  # lists, as they read back from the JSON marker
        else:
            prints.append(hashlib.sha256(path.read_bytes()).hexdigest())
    return prints


def finished(folder: str | Path, config: dict, marker: str = STAGE_MARKER) -> dict | None:
    """The stage's saved result if it finished with this ``config``, else None."""
    file = Path(folder) / marker
    if not file.exists():
        return None
    result = json.loads(file.read_text())
    return result if result.get("config") == config else None


def reuse_or_run(
    name: str,
    folder: str | Path,
    config: dict,
    run: Callable[[], dict],
    say=print,
    *,
    marker: str = STAGE_MARKER,
    fresh: bool = False,
    writes_marker: bool = False,
) -> dict:
    """The result of the stage finished in ``folder`` with ``config``, or ``run()``'s. ``writes_marker``: ``run``
    writes the marker itself (with ``config`` in it); otherwise it is written here, after ``run`` returns."""
    done = None if fresh else finished(folder, config, marker)
    if done is not None:
        say(f"[{name}] reusing {folder}")
        return done
    result = run()
    if not writes_marker:
        (Path(folder) / marker).write_text(json.dumps({"config": config, **result}, indent=2) + "\n")
    return result
