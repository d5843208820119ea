"""Named presets of the doubling commands, and their backends (``ppo --backend``, ``compare --backends``).

A preset is plain data: trainer options (``PPOConfig`` fields) and their values. It applies over the command's
defaults and under the YAML file and the flags (``trl_ext.settings.layers``), so an option the user gives always holds.
A backend is a runner of ``trl_ext.runs.runners`` with, for the critic-free rows, the preset its row runs. How each
preset's values were found: docs/decisions.md, "The critic-free rows' settings".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trl_ext.ppo.config import PPOConfig
from trl_ext.settings.layers import Layer, preset_layer, under_user

GROUP_SIZE = 8  # completions per prompt of the group rows but the -matched ones (4, as `ppo --num-generations 4`)

# One gradient step a batch, clipped at 1.0, as TRL's GRPO/RLOO rows train.
_ONE_STEP = {"num_ppo_epochs": 1, "num_mini_batches": 1, "max_grad_norm": 1.0}
# TRL's GRPO row: its KL is the loss term beta, at the doubling task's KL weight (ppo_settings: kl_coef 0.2), none
# in the reward; 'bnpo' is TRL's default 'dapo' in one process with one step a generation.
_GRPO = {
    **_ONE_STEP,
    "advantage_estimator": "grpo",
    "num_generations": GROUP_SIZE,
    "kl_coef": 0.0,
    "beta": 0.2,
    "loss_type": "bnpo",
}
# TRL's RLOO row: the KL in the reward, summed over the sequence (k1), one ratio a sequence.
_RLOO = {
    **_ONE_STEP,
    "advantage_estimator": "rloo",
    "num_generations": GROUP_SIZE,
    "kl_estimator": "k1",
    "kl_mode": "sequence",
    "beta": 0.0,
    "policy_loss": "sequence_clip",
    "loss_type": "grpo",
}

PRESETS: dict[str, dict] = {
    "grpo": _GRPO,
    "rloo": _RLOO,
    # one step a batch at lr 7e-4; GRPO scales by the batch's std, not each group's
    "grpo-quick": {**_GRPO, "learning_rate": 7e-4, "scale_rewards": "batch"},
    "rloo-quick": {**_RLOO, "learning_rate": 7e-4},
    # two epochs a batch (TRL's num_iterations) at lr 1e-3
    "grpo-tuned": {**_GRPO, "learning_rate": 1e-3, "scale_rewards": "batch", "num_ppo_epochs": 2},
    "rloo-tuned": {**_RLOO, "learning_rate": 1e-3, "num_ppo_epochs": 2},
    # what `ppo --advantage-estimator grpo` (or rloo) starts from: the -tuned settings in two minibatches (four
    # optimizer steps a batch), which reach greedy exact 0.99 within 6,400 episodes
    "grpo-default": {
        **_GRPO,
        "learning_rate": 1e-3,
        "scale_rewards": "batch",
        "num_ppo_epochs": 2,
        "num_mini_batches": 2,
    },
    # plus GRPO's KL loss term: with the KL in the reward alone, a prefix whose group all chose one wrong set has
    # no advantage left to leave it (docs/decisions.md, "Why a run settles")
    "rloo-default": {**_RLOO, "learning_rate": 1e-3, "num_ppo_epochs": 2, "num_mini_batches": 2, "beta": 0.2},
    # TRL's trainers at what `ppo --advantage-estimator grpo|rloo --num-generations 4` runs, as far as TRL can
    # express it: 4 generations, two epochs of two minibatches (TRL's num_iterations, steps_per_generation); RLOO
    # without the KL loss term, which TRL's RLOO lacks (its beta is our kl_coef)
    "grpo-matched": {
        **_GRPO,
        "learning_rate": 1e-3,
        "scale_rewards": "batch",
        "num_ppo_epochs": 2,
        "num_mini_batches": 2,
        "num_generations": 4,
    },
    "rloo-matched": {**_RLOO, "learning_rate": 1e-3, "num_ppo_epochs": 2, "num_mini_batches": 2, "num_generations": 4},
    # REINFORCE++: KL-shaped token rewards, one completion a prompt
    "reinforce_pp": {**_ONE_STEP, "advantage_estimator": "reinforce_pp", "num_generations": 1, "beta": 0.0},
}

# `ppo --advantage-estimator ESTIMATOR` on the scratch backend starts from these presets instead of PPO's values
# (docs/decisions.md, "Defaults that fit the estimator").
ESTIMATOR_PRESETS = {"grpo": "grpo-default", "rloo": "rloo-default"}


@dataclass(frozen=True)
class Backend:
    runner: str  # a key of trl_ext.runs.runners.RUNNERS
    preset: str | None = None  # a key of PRESETS: the options its row runs with


BACKENDS: dict[str, Backend] = {
    "scratch": Backend("scratch"),  # trl-ext's trainer
    "trl": Backend("trl"),  # TRL 1.12's PPOTrainer
    # TRL's critic-free trainers, for comparison, and ours configured alike ('scratch-ALGO')
    "grpo": Backend("grpo", "grpo"),
    "rloo": Backend("rloo", "rloo"),
    "grpo-tuned": Backend("grpo", "grpo-tuned"),
    "rloo-tuned": Backend("rloo", "rloo-tuned"),
    "grpo-matched": Backend("grpo", "grpo-matched"),
    "rloo-matched": Backend("rloo", "rloo-matched"),
    "scratch-grpo": Backend("scratch", "grpo"),
    "scratch-rloo": Backend("scratch", "rloo"),
    "scratch-reinforce_pp": Backend("scratch", "reinforce_pp"),
    "scratch-grpo-tuned": Backend("scratch", "grpo-tuned"),
    "scratch-rloo-tuned": Backend("scratch", "rloo-tuned"),
    "scratch-grpo-quick": Backend("scratch", "grpo-quick"),
    "scratch-rloo-quick": Backend("scratch", "rloo-quick"),
}
BACKEND_NAMES = tuple(BACKENDS)


def preset_for(backend: str, advantage_estimator: str) -> Layer | None:
    """The preset a doubling run starts from: its backend's, or, on plain ``scratch``, its estimator's (none for a
    backend name that is not one: the backend option refuses it)."""
    if backend not in BACKENDS:
        return None
    name = BACKENDS[backend].preset
    if name is None and backend == "scratch":
        name = ESTIMATOR_PRESETS.get(advantage_estimator)
    return preset_layer(name, PRESETS[name]) if name else None


def row_config(cfg: PPOConfig, sources: dict, backend: str) -> tuple[PPOConfig, dict]:
    """The config a row of ``backend`` trains with (``compare``, ``demo``): its preset (``preset_for``) over the
    command's defaults and under the options ``sources`` says the user gave; and the sources updated."""
    preset = preset_for(backend, cfg.advantage_estimator)
    if preset is None:
        return cfg, sources
    values, sources = under_user(preset, asdict(cfg), sources)
    return PPOConfig(**values), sources
