"""The import path benchmarks/ read the machine from; it lives in ``trl_ext.machine`` (the doubling pipeline's
report: ``trl_ext.doubling.report``). Kept for the benchmark scripts that still import it here."""

from trl_ext.machine import device_tag, machine

__all__ = ["device_tag", "machine"]
