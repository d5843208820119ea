"""One step off-policy (``max_staleness=1``): the next batch rolls out on a background thread while the trainer
updates on this one.

The engine holds a copy of the weights of its own (vLLM colocated or a vLLM server), so it can sample while the
policy's parameters move. Before a background rollout starts, the main thread syncs the engine to the weights it
has then, so batch k+1 comes from the weights after update k-1 and reaches the trainer one update old; the
importance-sampling correction (the engine's log-probs against the trainer's) weighs that lag, and the critic's
values and the old log-probs are computed when the batch arrives, by the current model. The background thread
touches the engine, the rollout (and its tools or environment) and a generator of its own, never the trained
module, the trainer's generator or an optimizer.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from trl_ext.errors import InputError
from trl_ext.rollouts import Rollout, RolloutBatch

STALENESS = (0, 1)


def check_staleness(max_staleness: int, sampler, rollout_func, environment_factory=None) -> None:
    """Refuse one step off-policy where the engine samples from the trained module itself (the HF engines), a
    TRL ``rollout_func`` is handed the trainer (it may touch the model while the update runs), or environments
    would be reset for the next batch while this batch's rewards still read them."""
    if max_staleness not in STALENESS:
        raise InputError(f"max_staleness must be 0 (on-policy) or 1 (one step off-policy); got {max_staleness!r}")
    if not max_staleness:
        return
    if not getattr(sampler, "holds_weights", False):
        raise InputError(
            f"max_staleness 1 needs an engine with weights of its own (sampler 'vllm', colocated or server); "
            f"{type(sampler).__name__} samples from the policy being trained"
        )
    if rollout_func is not None:
        raise InputError("max_staleness 1 does not take a rollout_func: TRL hands it the trainer, which is updating")
    if environment_factory is not None:
        raise InputError(
            "max_staleness 1 does not take an environment_factory yet: the next batch would reset the environments "
            "this batch's rewards read (tools alone are fine)"
        )


class RolloutAhead:
    """The one rollout in flight: ``start(rows)`` on the main thread once the engine holds the weights to sample
    from, ``take()`` for its batch (a rollout's error is raised there, on the main thread)."""

    def __init__(self, rollout: Rollout, sampling):
        self.rollout, self.sampling = rollout, sampling
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trl-ext-rollout-ahead")
        self._pending: Future | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def start(self, rows: dict) -> None:
        if self._pending is not None:
            raise RuntimeError("a rollout is already in flight")  # one step off at most
        self._pending = self._pool.submit(self.rollout.rollout, rows, self.sampling)

    def take(self) -> RolloutBatch:
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("no rollout in flight")
        return pending.result()

    def wait(self) -> None:
        """Until the rollout in flight has ended (its batch kept): the engine is then free for another caller."""
        if self._pending is not None:
            self._pending.exception()

    def close(self) -> None:
        """Wait for a rollout still in flight and drop its batch (the thread stays for a later ``train()``)."""
        if self._pending is not None:
            self._pending.exception()  # waits; an error there no longer matters
            self._pending = None
