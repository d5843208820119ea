"""Timing the phases of an update end to end, so that their sum is the update's wall time."""

from __future__ import annotations

import time

import torch


class PhaseClock:
    """``lap(name)`` records the seconds since the last lap as ``timing/<name>``. On a GPU each reading waits for
    the queued work: CUDA is asynchronous, and an unsynchronised timer charges a phase's kernels to the next one."""

    def __init__(self, device: torch.device):
        self.device, self.timings = device, {}
        self._tick = self.now()

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def lap(self, name: str) -> None:
        now = self.now()
        self.timings[f"timing/{name}"], self._tick = now - self._tick, now
