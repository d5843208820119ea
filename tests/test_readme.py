import re
from pathlib import Path

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
