"""The doubling pipeline's worker processes: a pool of one-torch-thread workers, and the policy's pretraining data
parallel over them (gloo). Why one thread a process: docs/decisions.md, "Data-parallel pretraining"."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

from trl_ext.tasks.doubling.stages import PretrainConfig, run_pretrain


def _worker_setup(trl_backend: bool, setup: Callable[[], None] | None):
    """Each worker: one torch thread (a core each), the caller's ``setup`` (the CLI's quiet output), and the PPO
    run's imports done while the main process trains the classifier."""
    import torch

    torch.set_num_threads(1)
    if setup is not None:
        setup()
    import trl_ext.ppo.trainer  # noqa: F401
    import trl_ext.tasks.doubling.artifacts  # noqa: F401
    from trl_ext.trl_compat import trl_ppo_available

    if trl_backend and trl_ppo_available():  # TRL's PPO imports DeepSpeed: seconds better spent beside the classifier
        import trl.experimental.ppo  # noqa: F401


def cores(jobs: int) -> int:
    """The processes (or threads) ``--jobs`` gets: no more than the machine's cores."""
    import os

    return min(jobs, os.cpu_count() or 1)


@contextmanager
def worker_pool(jobs: int, backends: list[str], setup: Callable[[], None] | None = None):
    """A pool of ``jobs`` worker processes for the pipeline's stages (None for ``jobs`` 1: all in this process);
    ``setup`` (picklable) runs first in each."""
    import multiprocessing

    jobs = cores(jobs)
    if jobs <= 1:
        yield None
        return
    # spawn: each child starts clean (no inherited torch threads or accelerate state)
    pool = multiprocessing.get_context("spawn").Pool(
        jobs, initializer=_worker_setup, initargs=("trl" in backends, setup)
    )
    try:
        yield pool
    except BaseException:
        pool.terminate()  # Ctrl-C or a failed run: stop the others now; finished stages stay reusable
        raise
    pool.close()
    pool.join()


def pretrain_on(workers, processes: int, cfg: PretrainConfig) -> dict:
    """Pretraining as ``processes`` data-parallel ranks on the pool's workers (gloo, one thread each), rank 0's
    summary. Two threads in one process would be as fast on idle cores, but every op then waits for both, and
    with another process on a core a step took 2x to 50x longer; ranks wait once a step. The pool must have
    ``processes`` idle workers (``worker_pool`` makes it that size): a rank left queued would stall the others."""
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as rendezvous:
        store = f"file://{rendezvous}/store"
        pending = [workers.apply_async(_pretrain_rank, (cfg, rank, processes, store)) for rank in range(processes)]
        while not all(p.ready() for p in pending):  # a failed rank ends the others' collectives at once
            time.sleep(0.1)
    failures = []
    for p in pending:
        try:
            p.get()
        except BaseException as error:  # noqa: BLE001 - re-raised below, the cause first
            failures.append(error)
    if failures:
        import torch.distributed as dist

        # The rank that failed first raised the cause; the others only saw their peer go.
        raise next((e for e in failures if not isinstance(e, dist.DistError)), failures[0])
    return pending[0].get()


def _pretrain_rank(cfg: PretrainConfig, rank: int, processes: int, store: str) -> dict | None:
    """One rank of ``pretrain_on``, in a worker: joins the group, trains its share, leaves the group (the worker
    then runs PPO, which must not find a process group)."""
    from datetime import timedelta

    import torch.distributed as dist

    # A rank that never joins, or hangs, fails the others once this runs out (one that raises closes its
    # connections on the way out, and the others fail at their next step).
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=processes, timeout=timedelta(minutes=2))
    try:
        return run_pretrain(cfg, rank=rank, world_size=processes)
    finally:
        dist.destroy_process_group()
