"""What a PPO run records, the same way for every backend and both PPO commands (``ppo``, ``rlhf``):
metrics per update, the task's held-out probes, the first point where a probe's metric reaches its target, and a
JSON-lines log."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trl_ext.errors import TrainingError
from trl_ext.ppo.update_metrics import numeric_metrics

KEY_METRICS = ("objective/scores", "objective/kl", "objective/entropy", "policy/clipfrac_avg", "loss/value_avg")


@dataclass
class History:
    """A run's updates: a row of metrics each (``metrics.jsonl``), and apart from them the last samples seen."""

    rows: list[dict] = field(default_factory=list)
    samples: list = field(default_factory=list)  # [(prompt, completion), ...] of the latest update that had any

    def add(self, row: dict, samples=None) -> None:
        self.rows.append(row)
        if samples:
            self.samples = [list(pair) for pair in samples]  # lists, as they read back from JSON

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def first(self) -> dict:
        return self.rows[0] if self.rows else {}

    @property
    def last(self) -> dict:
        return self.rows[-1] if self.rows else {}


def read_history(folder: Path) -> list[dict]:
    """The rows a run logged in ``folder/metrics.jsonl`` (none if it has no log)."""
    file = folder / "metrics.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


Probe = Callable[[object], dict]  # policy -> {metric: value}, the task's held-out check (doubling.ppo_run)


class RunRecorder:
    """Call ``record(update, stats, policy)`` after every update; it returns True to stop.

    Every ``probe_every`` updates it logs what ``probe(policy)`` measures (``probe/<metric>``), and notes the
    first update where ``probe/<target_metric>`` reaches ``target``. ``train_seconds`` counts from ``begin()``
    (after the trainer is built) to ``end()`` (before it saves), probes left out; setup time is kept apart in
    ``setup_seconds``.
    """

    def __init__(
        self,
        *,
        backend: str,
        probe: Probe | None = None,
        probe_every: int = 0,
        target_metric: str = "exact",
        target: float = 0.99,
        stop_at_target: bool = False,
        log_path: str | Path | None = None,
        print_fn=print,
        seed: int = 0,
        total_updates: int | None = None,
        resume_after: int | None = None,
        main_process: bool = True,
    ):
        from tqdm.auto import tqdm

        # The other processes of a launch keep the history only: no probes, log, lines or bar.
        if not main_process or probe is None:
            probe_every = 0
        if not main_process:
            log_path, print_fn = None, lambda *_: None
        self.backend, self.probe, self.probe_every, self.seed = backend, probe, probe_every, seed
        self.target_key, self.target, self.stop_at_target = f"probe/{target_metric}", target, stop_at_target
        self.log_path = Path(log_path) if log_path else None
        self.print_fn = print_fn
        self.history = History()
        self.created = self.start = time.perf_counter()
        self.stopped: float | None = None
        self.setup_seconds = 0.0
        self.probe_seconds = 0.0
        self.reached: dict | None = None
        # The log starts at the first record, so that a run refused before it (building the trainer) leaves no
        # log that would refuse the retry; a resumed log keeps the updates up to the checkpoint (only once the
        # trainer has accepted the checkpoint: a refused resume changes nothing).
        self.resume_after = resume_after
        self.log_started = False
        # A live bar on a terminal (main process only); logs and CI get the periodic lines alone.
        self.bar = tqdm(
            total=total_updates,
            desc=backend,
            leave=False,
            mininterval=1.0,
            disable=None if log_path is not None else True,
        )

    def close(self) -> None:
        self.bar.close()

    def begin(self) -> None:
        """Training starts now: what came before (loading, building the trainer) is setup."""
        self.start = time.perf_counter()
        self.setup_seconds = self.start - self.created

    def end(self) -> None:
        """Training is over: saving and evaluation do not count as training time."""
        self.stopped = time.perf_counter()

    @property
    def train_seconds(self) -> float:
        now = self.stopped if self.stopped is not None else time.perf_counter()
        return now - self.start - self.probe_seconds

    def record(self, update: int, stats: dict, policy) -> bool:
        row = {
            **numeric_metrics(stats),
            "backend": self.backend,
            "update": update,
            "train_seconds": round(self.train_seconds, 3),
        }
        bad = [k for k in KEY_METRICS if k in row and not math.isfinite(row[k])]
        if bad:
            raise TrainingError(f"{self.backend} PPO: non-finite {bad} at update {update}")
        if self.probe_every and update % self.probe_every == 0:
            tick = time.perf_counter()
            probed = self.probe(policy)
            self.probe_seconds += time.perf_counter() - tick
            row.update({f"probe/{name}": value for name, value in probed.items()})
            if self.reached is None and row.get(self.target_key, -math.inf) >= self.target:
                self.reached = {"update": update, "episode": row.get("episode"), "train_seconds": row["train_seconds"]}
            # the seed tells apart the lines of runs that print side by side (compare --jobs 2)
            self.print_fn(
                f"[{self.backend} seed {self.seed}] update {update} episode {row.get('episode')} "
                f"score {row.get('objective/scores', float('nan')):.3f} "
                f"kl {row.get('objective/kl', float('nan')):.3f} "
                f"probe {' '.join(f'{name} {value:.3f}' for name, value in probed.items())} "
                f"({row['train_seconds']:.1f}s)"
            )
        self.bar.update(1)
        self.bar.set_postfix(
            score=f"{row.get('objective/scores', float('nan')):.3f}",
            kl=f"{row.get('objective/kl', float('nan')):.3f}",
            refresh=False,
        )
        self.history.add(row, stats.get("samples"))
        if self.log_path is not None and not self.log_started:
            kept = (
                []
                if self.resume_after is None
                else [
                    line
                    for line in (self.log_path.read_text().splitlines() if self.log_path.exists() else [])
                    if json.loads(line).get("update", 0) <= self.resume_after
                ]
            )
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text("".join(line + "\n" for line in kept))
            self.log_started = True
        if self.log_path is not None:
            with self.log_path.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        return self.stop_at_target and self.reached is not None
