"""What a result was measured on: platform, Python, torch and its threads, the device, TRL."""

from __future__ import annotations

import platform


def machine() -> dict:
    """The machine and the versions a result came from (``results.json``, the benchmarks' files)."""
    import os

    import torch

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }
    try:
        import trl

        info["trl"] = trl.__version__
    except ImportError:  # pragma: no cover
        pass
    return info


def cpu_name() -> str | None:
    """The CPU's model name (Linux's /proc/cpuinfo), or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    except OSError:
        return None


def device_tag(info: dict) -> str:
    """``cpu`` or ``gpu-<name>``: the suffix of a benchmark's results file, from ``machine()``."""
    return "cpu" if info["device"] == "cpu" else "gpu-" + info["device"].replace(" ", "_")
