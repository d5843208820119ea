"""The CLI's error boundary: trl-ext's errors and OSError are one line and exit 2; a bug keeps its traceback."""

import pytest

from trl_ext.commands import cli
from trl_ext.commands.parsing import Command, CommandResult
from trl_ext.errors import BackendUnavailableError, InputError, TrainingError, TrlExtError
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.trainer import PPOError


def _one_command(monkeypatch, run):
    command = Command(help="test command", parts={}, run=run)
    monkeypatch.setattr(cli, "commands", lambda: {"boom": command})


def _raises(err):
    def run(opts) -> CommandResult:
        raise err

    return run


def test_hierarchy_keeps_the_builtin_types():
    assert issubclass(InputError, ValueError) and issubclass(InputError, TrlExtError)
    assert issubclass(TrainingError, RuntimeError) and issubclass(PPOError, TrainingError)
    assert issubclass(BackendUnavailableError, TrlExtError)
    with pytest.raises(InputError, match="learning_rate must be positive"):
        PPOConfig(learning_rate=0)


@pytest.mark.parametrize(
    "err",
    [
        InputError("bad option --x: 3\nsecond line"),
        FileNotFoundError("no file 'a'"),
        TrainingError("non-finite loss at update 3"),
        BackendUnavailableError("the trl backend needs TRL <= 1.12"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(monkeypatch, capsys, err):
    _one_command(monkeypatch, _raises(err))
    assert cli.main(["boom"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"trl-ext: error: {str(err).splitlines()[0]}\n"
    assert captured.out == ""


@pytest.mark.parametrize("err", [KeyError("objective/kl"), ValueError("a plain ValueError is a bug too")])
def test_a_bug_keeps_its_traceback(monkeypatch, err):
    _one_command(monkeypatch, _raises(err))
    with pytest.raises(type(err)):
        cli.main(["boom"])


def _two_layers():
    import torch

    class TwoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj, self.down_proj = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)

    return TwoLayers()


def test_a_library_input_error_is_one_line(monkeypatch, capsys):
    """peft's target-module mismatch, translated where the adapter is built, lists the modules that would fit."""
    from peft import LoraConfig

    from trl_ext.models.loading import peft_model

    _one_command(monkeypatch, lambda opts: peft_model(_two_layers(), LoraConfig(target_modules=["q_proj"])))
    assert cli.main(["boom"]) == 2
    assert capsys.readouterr().err == (
        "trl-ext: error: LoRA target modules q_proj match no module of the policy "
        "(TwoLayers); its linear modules: up_proj, down_proj (or 'all-linear')\n"
    )


def test_other_library_errors_keep_their_traceback(monkeypatch):
    import peft
    from peft import LoraConfig

    from trl_ext.models.loading import peft_model

    def broken(model, config, *args, **kwargs):
        raise ValueError("something inside peft went wrong")

    monkeypatch.setattr(peft, "get_peft_model", broken)
    _one_command(monkeypatch, lambda opts: peft_model(_two_layers(), LoraConfig(target_modules=["up_proj"])))
    with pytest.raises(ValueError, match="something inside peft went wrong"):
        cli.main(["boom"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ppo", "--batch-size", "x"], "trl-ext ppo: error: argument --batch-size: invalid int value: 'x'"),
        (["nope"], "trl-ext: error: argument command: invalid choice: 'nope'"),
        (["ppo", "--bogus", "1"], "trl-ext ppo: error: unrecognized arguments: --bogus 1 (`trl-ext ppo --help`"),
    ],
)
def test_argparses_errors_are_one_line_pointing_at_help(capsys, argv, message):
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(err) == 1 and err[0].startswith(message) and "--help` lists" in err[0]
