"""``rlhf --tools module:fn,... --environment module:Factory --tool-template NAME``: multi-turn PPO from the command
line, end to end on a tiny tool model, and the refusals it owes."""

import json
from pathlib import Path

from tool_models import tiny_tool_model

ROOT = Path(__file__).resolve().parents[1]

USER_CODE = '''
from trl_ext.agents import ToolResult


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


class Counter:
    def reset(self, **row):
        self.value = 0
        return " Count."

    def increment(self, step: int) -> str:
        """Add to the counter.

        Args:
            step: How much to add.
        """
        self.value += step
        return ToolResult(str(self.value), reward=0.1)

    def get_reward(self) -> float:
        return float(self.value)
'''


def _files(tmp_path):
    (tmp_path / "agent_code.py").write_text(USER_CODE)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": [{"role": "user", "content": f"Go {i}."}]}) + "\n" for i in range(4))
    )
    return tiny_tool_model(tmp_path / "policy"), prompts


def test_rlhf_trains_with_tools_and_an_environment(tmp_path, monkeypatch):
    from trl_ext.agents.tools import Toolbox
    from trl_ext.commands.cli import main

    offered, made = set(), Toolbox.__post_init__

    def spy(box):
        made(box)
        offered.update(box.by_name)

    monkeypatch.setattr(Toolbox, "__post_init__", spy)

    policy, prompts = _files(tmp_path)
    code_file = tmp_path / "agent_code.py"
    out = tmp_path / "o"
    code = main(
        [
            "rlhf",
            "--policy",
            str(policy),
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            "--tools",
            f"{code_file}:multiply",
            "--environment",
            f"{code_file}:Counter",
            "--tool-template",
            "qwen2_5",
            "--max-tool-calling-iterations",
            "2",
            "--batch-size",
            "4",
            "--total-episodes",
            "4",
            "--response-length",
            "16",
            "--lora-r",
            "4",
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 1 and summary["first_score"] == 0.0  # get_reward alone: no call, counter 0
    assert summary["config"]["agents"]["environment"].endswith("agent_code.py:Counter")
    assert offered == {"multiply", "increment"}  # the --tools function reached the rollouts beside the environment's
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "tools/call_frequency" in metrics[-1] and "turns/per_rollout" in metrics[-1]


def test_rlhf_refuses_tools_on_the_trl_backend_and_a_missing_tool(tmp_path, capsys):
    from trl_ext.commands.cli import main

    policy, prompts = _files(tmp_path)
    common = [
        "rlhf",
        "--policy",
        str(policy),
        "--prompts",
        str(prompts),
        "--batch-size",
        "4",
        "--total-episodes",
        "4",
        "--response-length",
        "8",
        "--lora-r",
        "4",
    ]
    assert (
        main(
            [
                *common,
                "--out",
                str(tmp_path / "a"),
                "--backend",
                "trl",
                "--reward-fn",
                f"{tmp_path / 'agent_code.py'}:multiply",
                "--tools",
                f"{tmp_path / 'agent_code.py'}:multiply",
            ]
        )
        == 2
    )
    assert "--backend scratch" in capsys.readouterr().err
    assert main([*common, "--out", str(tmp_path / "b"), "--environment", f"{tmp_path / 'agent_code.py'}:Nowhere"]) == 2
    err = capsys.readouterr().err
    assert "environment" in err and "Nowhere" in err
