import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `from benchmarks import ...`

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    from trl_ext.tasks.doubling.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def trained_artifacts(tmp_path_factory):
    """A pretrained policy and reward classifier with the default recipes (about 30 s, once a session)."""
    from trl_ext.commands.stages import PretrainConfig, RewardConfig, run_pretrain, run_train_reward

    root = tmp_path_factory.mktemp("artifacts")
    policy = run_pretrain(PretrainConfig(out=str(root / "policy"), eval_n=200), show_progress=False)
    reward = run_train_reward(RewardConfig(out=str(root / "reward"), eval_n=500), show_progress=False)
    return {"policy": root / "policy", "reward": root / "reward", "policy_metrics": policy, "reward_metrics": reward}


# scripts/test.sh runs the suite on two TRL lines side by side, one core each. A test that depends on the
# TRL line (marked ``trl_api``, or ``needs_trl_ppo``) runs on the line(s) it concerns; every other test is
# TRL-agnostic and runs once: those of these files on the TRL 1.12 side, the rest on the newest TRL's, so
# that the two sides take about as long. A plain ``pytest`` runs everything.
AGNOSTIC_ON_THE_TRL112_SIDE = (
    "test_checkpoints.py",
    "test_reward_model.py",
    "test_ppo_trainer.py",
    "test_pipeline_foundation.py",
)
LINE_MARKERS = ("trl_api", "needs_trl_ppo")


def pytest_collection_modifyitems(config, items):
    """Marks the split above (``trl112_side``). Tests marked ``needs_trl_ppo`` run on TRL <= 1.12 only; on
    newer TRL they are skipped, saying why."""
    from trl_ext.trl_compat import trl_ppo_available, trl_ppo_unavailable_reason

    for item in items:
        if item.path.name in AGNOSTIC_ON_THE_TRL112_SIDE and not any(m in item.keywords for m in LINE_MARKERS):
            item.add_marker(pytest.mark.trl112_side)
    if trl_ppo_available():
        return
    skip = pytest.mark.skip(reason=trl_ppo_unavailable_reason())
    for item in items:
        if "needs_trl_ppo" in item.keywords:
            item.add_marker(skip)
