"""Bad input at the command line's edges: one line naming the problem, before anything trains, nothing lost."""

import hashlib
import math

import pytest

from trl_ext.commands.cli import main
from trl_ext.errors import InputError


def _error(capsys, args) -> str:
    """The one error line ``trl-ext ARGS`` prints (exit 2, no traceback)."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trl-ext: error: "), err
    return err[0]


@pytest.fixture(scope="module")
def untrained(tmp_path_factory, tokenizer):
    """An untrained policy and charset classifier saved as real folders (the checks read them, nothing trains)."""
    from trl_ext.tasks.doubling.artifacts import save_artifact
    from trl_ext.tasks.doubling.models import build_classifier, build_policy

    root = tmp_path_factory.mktemp("untrained")
    save_artifact(build_policy(tokenizer), tokenizer, root / "policy")
    save_artifact(build_classifier(tokenizer), tokenizer, root / "reward")
    return root


@pytest.mark.parametrize("stage", ["pretrain", "train-reward", "train-reward-model"])
def test_a_stage_never_overwrites_a_saved_model_unasked(capsys, tmp_path, untrained, stage):
    held = untrained / "policy" / "model.safetensors"
    before = hashlib.sha256(held.read_bytes()).hexdigest()
    line = _error(capsys, [stage, "--out", str(untrained / "policy"), "--steps", "1"])
    assert "already holds" in line and "--overwrite" in line
    assert hashlib.sha256(held.read_bytes()).hexdigest() == before
    (tmp_path / "afile").write_text("x")
    assert "is a file" in _error(capsys, [stage, "--out", str(tmp_path / "afile"), "--steps", "1"])


def test_a_stage_writes_into_a_held_folder_with_overwrite(capsys, tmp_path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = ["pretrain", "--out", str(out), "--steps", "2", "--batch-size", "4", "--eval-n", "4", "--warmup-steps", "1"]
    assert main([*args, "--overwrite"]) == 0
    assert (out / "model.safetensors").exists() and (out / "metrics.json").exists()
    assert (out / "notes.txt").read_text() == "mine"  # written into, never emptied


@pytest.mark.parametrize(
    "args, message",
    [
        (["pretrain", "--eval-n", "5000"], "eval_n must be in 1..1000 (the held-out questions), got 5000"),
        (["pretrain", "--warmup-steps", "-5"], "warmup_steps must not be negative, got -5"),
        (["train-reward", "--warmup-steps", "-1"], "warmup_steps must not be negative"),
        (["train-reward-model", "--warmup-steps", "-1"], "warmup_steps must not be negative"),
        (["pretrain", "--lr", "nan"], "lr must be positive, got nan"),
        (["eval", "--policy", "p", "--n", "1001"], "n must be in 1..1000"),
        (["demo", "--pretrain-steps", "0"], "pretrain_steps must be positive, got 0"),  # named as given, at once
        (["compare", "--reward-model-steps", "-3"], "reward_model_steps must be positive, got -3"),
    ],
)
def test_stage_options_are_checked_before_training(capsys, tmp_path, args, message):
    out = tmp_path / "out"
    line = _error(capsys, [*args, *([] if args[0] == "eval" else ["--out", str(out)])])
    assert message in line
    assert not out.exists()


def _ppo(untrained, out, *extra) -> list[str]:
    return ["ppo", "--policy", str(untrained / "policy"), "--reward", str(untrained / "reward"), "--out", str(out)] + [
        *extra
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--lam", "95"], "lam must be within [0, 1], got 95.0"),
        (["--gamma", "1.5"], "gamma must be within [0, 1], got 1.5"),
        (["--learning-rate", "nan"], "learning_rate must be positive, got nan"),
        (["--critic-init", "NOWHERE"], "critic_init directory"),
        (
            ["--vllm-importance-sampling-clip-min", "5", "--vllm-importance-sampling-clip-max", "1"],
            "0 <= vllm_importance_sampling_clip_min <= vllm_importance_sampling_clip_max",
        ),
        (["--vllm-importance-sampling-clip-max", "-1"], "a positive maximum"),
        (["--advantage-estimator", "grpo", "--kl-target", "6"], "as GRPO's presets set it: give kl_coef a start"),
    ],
)
def test_ppo_options_are_refused_before_the_output_folder(capsys, tmp_path, untrained, extra, message):
    extra = [str(tmp_path / "nowhere") if value == "NOWHERE" else value for value in extra]
    if "--critic-init" in extra:
        extra += ["--separate-critic"]
    assert message in _error(capsys, _ppo(untrained, tmp_path / "run", *extra))
    assert not (tmp_path / "run").exists()


def test_a_yaml_file_names_an_unknown_backend_and_where_its_syntax_breaks(capsys, tmp_path, untrained):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("backend: scratchh\n")
    assert "scratchh" in _error(capsys, _ppo(untrained, tmp_path / "run", "--config", str(cfg)))
    cfg.write_text("batch_size: 8\nlearning_rate: [1e-3\n")
    line = _error(capsys, _ppo(untrained, tmp_path / "run", "--config", str(cfg)))
    assert "is not valid YAML at line 3, column 1" in line and "expected ',' or ']'" in line


def test_user_code_that_does_not_import_is_one_line(capsys, tmp_path, untrained, monkeypatch):
    (tmp_path / "broken_reward.py").write_text("def broken(:\n    pass\n")
    (tmp_path / "needs_a_package.py").write_text(
        "import no_such_package_here\n\ndef f(completions, **kw):\n    return []\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    line = _error(capsys, _ppo(untrained, tmp_path / "a", "--reward-fn", f"{tmp_path / 'broken_reward.py'}:broken"))
    assert f"SyntaxError at {tmp_path / 'broken_reward.py'}:1" in line
    assert "SyntaxError at" in _error(capsys, _ppo(untrained, tmp_path / "b", "--reward-fn", "broken_reward:broken"))
    line = _error(capsys, _ppo(untrained, tmp_path / "c", "--reward-fn", f"{tmp_path / 'needs_a_package.py'}:f"))
    assert "No module named 'no_such_package_here'" in line


def test_a_reward_function_that_cannot_take_the_columns_is_refused_before_anything_runs(capsys, tmp_path, untrained):
    """TRL calls reward functions by keyword with every column: one without **kwargs is named with its fix, by
    ``ppo`` before its folder and by ``rlhf`` before SFT trains."""
    (tmp_path / "rf.py").write_text("def shorter(completions):\n    return [0.0 for _ in completions]\n")
    line = _error(capsys, _ppo(untrained, tmp_path / "run", "--reward-fn", f"{tmp_path / 'rf.py'}:shorter"))
    assert "reward function" in line and "takes (completions)" in line
    assert "give it **kwargs: def shorter(completions, **kwargs)" in line
    assert not (tmp_path / "run").exists()
    sft = tmp_path / "sft.jsonl"
    sft.write_text('{"prompt": "S数字:12x2=", "completion": "24E"}\n' * 4)
    (tmp_path / "prompts.txt").write_text("S数字:12x2=\n" * 4)
    args = ["rlhf", "--policy", str(untrained / "policy"), "--prompts", str(tmp_path / "prompts.txt")]
    args += ["--sft-data", str(sft), "--out", str(tmp_path / "rlhf")]
    line = _error(capsys, [*args, "--reward-fn", f"{tmp_path / 'rf.py'}:shorter"])
    assert "takes (completions)" in line and not (tmp_path / "rlhf").exists()
    # a group estimator with rlhf's one completion a prompt would train nothing: refused before SFT too
    (tmp_path / "ok.py").write_text("def ok(completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    line = _error(capsys, [*args, "--reward-fn", f"{tmp_path / 'ok.py'}:ok", "--advantage-estimator", "grpo"])
    assert "'grpo' compares the completions of one prompt and needs num_generations >= 2 (got 1)" in line
    assert not (tmp_path / "rlhf").exists()


def test_lora_options_are_checked():
    from trl_ext.runs.rlhf_options import LoRAOptions

    for bad, message in [
        (dict(lora_r=0), "lora_r must be positive"),
        (dict(lora_alpha=-4), "lora_alpha must be positive"),
        (dict(lora_dropout=1.5), r"lora_dropout must be in \[0, 1\)"),
    ]:
        with pytest.raises(InputError, match=message):
            LoRAOptions(**bad)
    LoRAOptions(lora_dropout=0.0)


def test_serve_reward_names_a_device_it_cannot_use():
    import torch

    from trl_ext.commands.serve_reward import _device

    with pytest.raises(InputError, match="--device 'gpu' is not a device"):
        _device("gpu")
    with pytest.raises(InputError, match=f"this machine has {torch.cuda.device_count()} CUDA devices"):
        _device(f"cuda:{torch.cuda.device_count()}")
    assert _device("cpu") == torch.device("cpu")


def test_demo_checks_every_row_before_any_stage_trains(capsys, tmp_path):
    out = tmp_path / "demo"
    line = _error(
        capsys, ["demo", "--out", str(out), "--backends", "scratch-grpo", "--batch-size", "12", "--jobs", "1"]
    )
    assert "batch_size 12 is not divisible by num_generations 8" in line
    assert not out.exists()  # refused before the folder, before pretraining
    assert "as GRPO's presets set it" in _error(
        capsys, ["compare", "--out", str(out), "--backends", "scratch-grpo", "--kl-target", "6", "--jobs", "1"]
    )
    assert not out.exists()


def test_nan_is_not_positive():
    from trl_ext.ppo.config import PPOConfig

    with pytest.raises(InputError, match="must be positive, got nan"):
        PPOConfig(learning_rate=math.nan)
