"""Bad input on the agent path (``rlhf --tools --environment``): a tool or an environment method whose schema
transformers cannot build is one line naming it and what it lacks, exit 2, refused before ``--out`` is touched; the
corrected retry then runs without ``--overwrite``."""

import json

import pytest
from tool_models import tiny_tool_model

USER_CODE = '''
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def undocumented(a: int, b: int) -> int:
    return a * b


def unhinted(a: int, b) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def undescribed(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
    """
    return a * b


class Shape:
    pass


def shaped(shape: Shape) -> str:
    """Describe a shape.

    Args:
        shape: The shape.
    """
    return "a shape"


def zero(completions, **kwargs):
    return [0.0] * len(completions)


class Counter:
    def reset(self, **row):
        self.value = 0

    def increment(self, step: int) -> str:
        """Add to the counter.

        Args:
            step: How much to add.
        """
        self.value += step
        return str(self.value)

    def get_reward(self) -> float:
        return float(self.value)


class UndocumentedCounter:  # no subclass of Counter: a method inherits its parent's docstring (inspect.getdoc)
    def reset(self, **row):
        self.value = 0

    def increment(self, step: int) -> str:
        self.value += step
        return str(self.value)
'''

REFUSALS = {  # the option that names the bad tool -> the start of its line
    "tool without a docstring": (("--tools", "undocumented"), "tool 'undocumented' has no docstring"),
    "tool argument without a type hint": (
        ("--tools", "unhinted"),
        "tool 'unhinted' has no type hint on its argument 'b'",
    ),
    "tool argument the docstring does not describe": (
        ("--tools", "undescribed"),
        "tool 'undescribed' has no description of its argument 'b' in its docstring",
    ),
    "environment method without a docstring": (
        ("--environment", "UndocumentedCounter"),
        "environment method 'UndocumentedCounter.increment' has no docstring",
    ),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent_input")
    (root / "agent_code.py").write_text(USER_CODE)
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": [{"role": "user", "content": f"Go {i}."}]}) + "\n" for i in range(4))
    )
    return {"code": root / "agent_code.py", "policy": tiny_tool_model(root / "policy"), "prompts": prompts}


def _rlhf(files, out, option: str, name: str) -> list[str]:
    return [
        "rlhf",
        "--policy",
        str(files["policy"]),
        "--prompts",
        str(files["prompts"]),
        "--out",
        str(out),
        option,
        f"{files['code']}:{name}",
        "--reward-fn",
        f"{files['code']}:zero",
        "--tool-template",
        "qwen2_5",
        "--batch-size",
        "4",
        "--total-episodes",
        "4",
        "--response-length",
        "16",
        "--lora-r",
        "4",
    ]


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_tool_transformers_cannot_describe_is_one_line_and_writes_nothing(files, tmp_path, capsys, case):
    from trl_ext.commands.cli import main

    (option, name), line = REFUSALS[case]
    out = tmp_path / "out"
    assert main(_rlhf(files, out, option, name)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trl-ext: error: {line}") and err.count("\n") == 1, err
    assert not out.exists()


def test_the_corrected_retry_runs_without_overwrite(files, tmp_path, capsys):
    from trl_ext.commands.cli import main

    out = tmp_path / "out"
    out.mkdir()  # a folder the user made: the refused run must leave it as it was
    assert main(_rlhf(files, out, "--environment", "UndocumentedCounter")) == 2
    assert "UndocumentedCounter.increment" in capsys.readouterr().err
    assert list(out.iterdir()) == []
    assert main(_rlhf(files, out, "--environment", "Counter")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 1
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_the_trainer_path_refuses_them_with_the_same_lines(files):
    """What ``PPOTrainer(tools=..., environment_factory=...)`` checks: ``check_tools`` and the pool's probe."""
    from trl_ext.agents.environments import EnvironmentPool
    from trl_ext.agents.tools import check_tools
    from trl_ext.errors import InputError
    from trl_ext.settings.user_code import import_object

    def user(name):
        return import_object(f"{files['code']}:{name}", "tool")

    for (option, name), line in REFUSALS.values():
        with pytest.raises(InputError, match=f"^{line}"):
            check_tools([user(name)]) if option == "--tools" else EnvironmentPool(user(name)).probe_tools()
    with pytest.raises(
        InputError,
        match="^tool 'shaped' has a type hint transformers cannot turn into a JSON "
        "schema: Couldn't convert the type hint",
    ):
        check_tools([user("shaped")])
    check_tools([user("multiply"), *EnvironmentPool(user("Counter")).probe_tools()])


def test_the_metrics_log_starts_at_the_first_update(tmp_path):
    """A run refused while its trainer is built leaves no metrics.jsonl, which would refuse the retry; a resumed
    log still keeps its updates up to the checkpoint."""
    from trl_ext.runs.recorder import RunRecorder

    log = tmp_path / "metrics.jsonl"
    recorder = RunRecorder(backend="x", log_path=log, print_fn=lambda *_: None)
    assert not log.exists()
    recorder.record(1, {"objective/scores": 0.5}, policy=None)
    assert [json.loads(line)["update"] for line in log.read_text().splitlines()] == [1]

    log.write_text("".join(json.dumps({"update": u}) + "\n" for u in range(1, 6)))
    resumed = RunRecorder(backend="x", log_path=log, print_fn=lambda *_: None, resume_after=3)
    assert len(log.read_text().splitlines()) == 5  # untouched until the trainer has accepted the checkpoint
    resumed.record(4, {"objective/scores": 0.5}, policy=None)
    assert [json.loads(line)["update"] for line in log.read_text().splitlines()] == [1, 2, 3, 4]
    recorder.close()
    resumed.close()
