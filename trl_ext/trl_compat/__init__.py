"""Everything that needs TRL 1.12's PPO (``trl.experimental.ppo``), in one place.

TRL removed ``PPOTrainer`` in 1.13. trl-ext itself runs on any TRL >= 1.10; only the ``trl``
backend (TRL's own PPOTrainer, kept as the reference we compare against) needs the old line,
installed with the ``trl-ppo`` extra. Nothing here imports ``trl.experimental.ppo`` at import
time: call ``require_trl_ppo()`` first, then import ``trl_ext.trl_compat.backend``.
"""

from __future__ import annotations

from trl_ext.errors import BackendUnavailableError

INSTALL_HINT = "pip install 'trl-ext[trl-ppo]' (which installs trl>=1.10,<1.13)"
LAST_TRL_WITH_PPO = (1, 12)


class TRLPPOUnavailable(BackendUnavailableError, ValueError):
    """The installed TRL has no PPOTrainer."""


def installed_trl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return "not installed"


def _major_minor(text: str) -> tuple[int, int]:
    parts = (text.split(".") + ["0", "0"])[:2]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)


def trl_ppo_available() -> bool:
    version = installed_trl_version()
    return version != "not installed" and _major_minor(version) <= LAST_TRL_WITH_PPO


def trl_ppo_unavailable_reason() -> str:
    return (
        f"TRL's PPOTrainer needs TRL <= 1.12 (TRL 1.13 removed it); installed TRL is "
        f"{installed_trl_version()}: {INSTALL_HINT}"
    )


def require_trl_ppo(what: str = "the 'trl' backend") -> None:
    """Raise ``TRLPPOUnavailable`` (one line: installed version, install command) on TRL >= 1.13."""
    if not trl_ppo_available():
        raise TRLPPOUnavailable(
            f"{what} runs TRL's PPOTrainer, which needs TRL <= 1.12 (TRL 1.13 removed it); "
            f"installed TRL is {installed_trl_version()}. Get it with: {INSTALL_HINT}"
        )
