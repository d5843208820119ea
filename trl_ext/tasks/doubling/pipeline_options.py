"""Which stages and backends ``trl-ext demo`` and ``trl-ext compare`` run (``trl_ext.tasks.doubling.pipeline``)."""

from __future__ import annotations

from dataclasses import dataclass

from trl_ext.errors import InputError
from trl_ext.settings.fields import field, require_positive
from trl_ext.tasks.doubling.presets import BACKEND_NAMES
from trl_ext.tasks.doubling.stages import PretrainConfig, RewardConfig, RewardModelConfig

# What PPO is rewarded with: the charset classifier, or the scalar reward model trained on the doubling
# preference pairs, which also sees wrong values (the classifier sees only the character set).
REWARDS = ("classifier", "reward_model")


def _names(text: str) -> list[str]:
    return [b.strip() for b in text.split(",") if b.strip()]


@dataclass
class PipelineOptions:
    """Which stages and backends the pipeline runs, and whether it may reuse finished stages."""

    backends: str = field(
        "trl,scratch",
        help=f"comma-separated, from {', '.join(BACKEND_NAMES)}. A critic-free row "
        "runs its backend's preset (trl_ext/tasks/doubling/presets.py) over this command's defaults; the "
        "options you give (YAML, flags) apply to every row, over its preset",
    )
    rewards: str = field(
        "classifier",
        help="comma-separated, from classifier (the charset classifier's logit) and "
        "reward_model (a scalar reward model trained on preference pairs, from the pretrained policy)",
    )
    pretrain_steps: int = field(PretrainConfig.steps, help="policy pretraining steps")
    reward_steps: int = field(RewardConfig.steps, help="reward classifier training steps")
    reward_model_steps: int = field(
        RewardModelConfig.steps, help="reward model training steps (--rewards reward_model)"
    )
    reward_model_temperature: float = field(
        1.2,
        help="rollout temperature of the +rm runs (the classifier runs use "
        "--temperature): a reward model can only punish the wrong values PPO "
        "samples, and at 1.0 they are rare",
    )
    jobs: int = field(
        2,
        help="PPO runs at once, each in its own process (the demo command's OMP_NUM_THREADS=1 "
        "gives each one torch thread), and the processes pretraining runs data parallel on (their "
        "dropout masks differ from one process's, so the policy does too); 1: all in this process",
    )
    fresh: bool = field(False, help="rebuild every stage even where finished results exist")
    reward_url: str | None = field(
        None,
        help="score every PPO run through this reward server (`trl-ext "
        "serve-reward`'s address) instead of the classifier trained here",
    )

    def __post_init__(self):
        unknown = [b for b in self.backend_list if b not in BACKEND_NAMES]
        if not self.backend_list or unknown:
            raise InputError(f"unknown backend(s) {unknown or self.backends!r}: choose from {', '.join(BACKEND_NAMES)}")
        unknown = [r for r in self.reward_list if r not in REWARDS]
        if not self.reward_list or unknown:
            raise InputError(f"unknown reward(s) {unknown or self.rewards!r}: choose from {', '.join(REWARDS)}")
        # checked here, not when the stage starts: minutes in, and named as the stage's `steps`
        require_positive(
            self, "jobs", "reward_model_temperature", "pretrain_steps", "reward_steps", "reward_model_steps"
        )
        if self.reward_url and self.reward_list != ["classifier"]:
            raise InputError("--reward-url replaces the classifier reward: give it with --rewards classifier")

    @property
    def backend_list(self) -> list[str]:
        return _names(self.backends)

    @property
    def reward_list(self) -> list[str]:
        return _names(self.rewards)
