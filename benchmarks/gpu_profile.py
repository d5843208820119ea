"""One update's phases profiled (``benchmarks/gpu.py --profile``): each phase's busiest kernels, its device time, and
the memory it started with and peaked at, so that a missed speed or memory target has a measured cause.

The profiled update runs after the timed ones and is reported apart: profiling slows what it watches.
"""

from __future__ import annotations

import time

TOP_KERNELS = 12


def _device_time(event, gpu: bool) -> float:
    """An averaged event's own time in microseconds: on the device (kernels, copies) on a GPU, else on the CPU."""
    if not gpu:
        return event.self_cpu_time_total
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)


class PhaseProfiler:
    """``wrap(name, function)``: ``function`` profiled as phase ``name`` while ``active``, else called as it is.
    ``phases``: each profiled phase's wall seconds, device milliseconds, its ``TOP_KERNELS`` busiest kernels
    (milliseconds, calls), memory allocated at its start and its peak (MiB, GPU only). ``peaks_before``: the
    allocator's allocated and reserved peaks (MiB) as profiling began, the row's own (each phase resets them)."""

    def __init__(self, gpu: bool):
        self.gpu, self.active, self.phases = gpu, False, {}
        self.peaks_before: tuple[float, float] | None = None

    def start(self) -> None:
        if self.gpu:
            import torch

            allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
            self.peaks_before = (round(allocated / 2**20, 1), round(reserved / 2**20, 1))
        self.active = True

    def wrap(self, name: str, function):
        def wrapped(*args, **kwargs):
            if not self.active or name in self.phases:
                return function(*args, **kwargs)
            return self._profiled(name, function, args, kwargs)

        return wrapped

    def _profiled(self, name, function, args, kwargs):
        import torch
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.gpu else [])
        held = None
        if self.gpu:
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() / 2**20
            torch.cuda.reset_peak_memory_stats()
        began = time.perf_counter()
        with profile(activities=activities) as prof:
            result = function(*args, **kwargs)
            if self.gpu:
                torch.cuda.synchronize()
        seconds = time.perf_counter() - began
        events = [
            e
            for e in prof.key_averages()
            if _device_time(e, self.gpu) > 0 and (not self.gpu or e.device_type == DeviceType.CUDA)
        ]
        events.sort(key=lambda e: _device_time(e, self.gpu), reverse=True)
        self.phases[name] = {
            "seconds": round(seconds, 3),
            "device_ms": round(sum(_device_time(e, self.gpu) for e in events) / 1000, 2),
            "kernels": [
                {"name": e.key[:160], "ms": round(_device_time(e, self.gpu) / 1000, 2), "calls": e.count}
                for e in events[:TOP_KERNELS]
            ],
            "held_mb_at_start": round(held, 1) if held is not None else None,
            "peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if self.gpu else None,
        }
        return result


def summary(profile: dict) -> str:
    """A profile's phases as a few lines each: seconds, device time, memory, the five busiest kernels."""
    lines = []
    for name, phase in profile.items():
        memory = (
            f", {phase['held_mb_at_start']:,.0f} MiB held, peak {phase['peak_mb']:,.0f}" if phase["peak_mb"] else ""
        )
        lines.append(f"  {name}: {phase['seconds']:.3f} s, device {phase['device_ms']:.1f} ms{memory}")
        lines += [f"    {k['ms']:8.2f} ms {k['calls']:6d}x {k['name'][:100]}" for k in phase["kernels"][:5]]
    return "\n".join(lines)
