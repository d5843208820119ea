import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_first_screen_gives_demo_and_test_commands():
    first_screen = "\n".join(README.splitlines()[:40])
    assert "trl-ext demo" in first_screen and "bash scripts/test.sh" in first_screen
    assert "scripts/test.sh" in (ROOT / ".ci/run").read_text()


def test_reward_adapter_example_runs(trained_artifacts, capsys):
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "load_classifier(" in b)
    exec(block.replace('"runs/reward"', repr(str(trained_artifacts["reward"]))), {})
    high, low = eval(capsys.readouterr().out.strip().splitlines()[-1])
    assert high > 2.0 > low


@pytest.mark.trl_api  # the README's example on TRL's GRPOTrainer
def test_current_trl_example_runs(tmp_path):
    """The "With TRL >= 1.13" example, with tiny models of the same architectures in place of the paths."""
    from tiny_models import tiny_deberta_reward, tiny_qwen2

    policy = tiny_qwen2(tmp_path / "qwen2", chat_template=True)
    reward = tiny_deberta_reward(tmp_path / "deberta")
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "policy_dir, reward_dir =" in b)
    block = (block.replace('"runs/qwen2.5-0.5b-instruct"', repr(str(policy)))
             .replace('"runs/deberta-v3-reward-model"', repr(str(reward)))
             .replace('"runs/ppo_chat"', repr(str(tmp_path / "out"))))
    scope = {}
    exec(block, scope)
    history = scope["history"]
    assert len(history) == 2 and "rewards/says_the_word/mean" in history[-1]
    assert "rewards/deberta/mean" in history[-1] and "rewards/brevity/mean" in history[-1]
    assert (tmp_path / "out" / "adapter_config.json").exists() or (tmp_path / "out" / "config.json").exists()
