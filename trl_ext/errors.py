"""The exceptions trl-ext raises on purpose, one family a caller (and the CLI) can catch.

``InputError`` is also a ``ValueError`` and ``TrainingError`` a ``RuntimeError``, so code written
against the built-in types keeps working. Anything else that escapes is a bug, not a user's mistake.
"""

from __future__ import annotations


class TrlExtError(Exception):
    """Base of every error trl-ext raises deliberately."""


class InputError(TrlExtError, ValueError):
    """Bad input: an option value, a file or its rows, a model directory that is not what was asked for."""


class BackendUnavailableError(TrlExtError):
    """A backend that cannot run in this environment (say TRL's PPO on TRL >= 1.13); the message says how to get it."""


class TrainingError(TrlExtError, RuntimeError):
    """Training could not go on (a non-finite loss, a run that diverged)."""


class RolloutEngineError(TrainingError):
    """The rollout engine stopped answering or answered wrongly (a vLLM server that is down, slow or serving
    another model): the run stops, what it trained saved."""
