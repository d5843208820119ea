"""Options that act only with another setting: one the user gives where it would change nothing is refused, naming
what it acts with; what a command's defaults or a preset set is theirs, and so is a user's value equal to it; TRL's
trainers' rows are judged by what those trainers read and fix, not by the scratch trainer's scopes; 'auto' choosing
an engine by machine warns."""

import argparse
import re
from pathlib import Path

import pytest

from trl_ext.commands.cli import commands, main
from trl_ext.commands.parsing import add_command_arguments, build_options
from trl_ext.errors import InputError
from trl_ext.ppo import PPOConfig
from trl_ext.ppo.option_scopes import inert_options

MEDIAN = str(Path(__file__).resolve().parents[1] / "recipes" / "extensions" / "median_baseline.py") + ":median_baseline"


@pytest.mark.parametrize(
    "settings, option, inert",
    [
        ({}, "scale_rewards", True),  # gae reads no group scaling
        ({"advantage_estimator": "grpo"}, "scale_rewards", False),
        ({"advantage_estimator": MEDIAN}, "scale_rewards", False),  # a user's estimator may read any option
        ({"advantage_estimator": "grpo"}, "vf_coef", True),
        ({"advantage_estimator": "rloo"}, "gamma", True),
        ({"advantage_estimator": "reinforce_pp"}, "gamma", False),
        ({"advantage_estimator": "reinforce_pp"}, "lam", True),
        ({"sampler": "loop"}, "vllm_gpu_memory_utilization", True),
        ({"sampler": "vllm"}, "vllm_gpu_memory_utilization", False),
        ({}, "vllm_gpu_memory_utilization", False),  # auto may pick vLLM: the trainer decides
        ({"sampler": "vllm", "vllm_mode": "server"}, "vllm_gpu_memory_utilization", True),  # the server's own
        ({}, "vllm_server_port", True),
        ({"sampler": "vllm", "vllm_mode": "server"}, "vllm_server_port", False),
        ({}, "vllm_importance_sampling_clip_max", True),
        ({}, "kl_horizon", True),
        ({"kl_target": 6.0}, "kl_horizon", False),
        ({}, "kl_loss_estimator", True),
        ({"beta": 0.1}, "kl_loss_estimator", False),
        ({}, "save_total_limit", True),
        ({"sampler": "vllm", "vllm_mode": "server"}, "save_total_limit", False),  # a lost server saves the run
        ({}, "learning_rate", False),
    ],
)
def test_an_option_is_inert_exactly_where_nothing_reads_it(settings, option, inert):
    config = PPOConfig(**settings)
    assert (option in config.inert_options([option])) is inert


def _options(command: str, args: list[str]):
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_command_arguments(parser, commands()[command])
    return build_options(commands()[command], parser.parse_args(args))


PPO = ["--policy", "p", "--reward", "r", "--out", "o"]


def test_the_command_line_refuses_an_inert_option_the_user_gave_naming_what_it_needs(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["ppo", "--policy", "p", "--reward", "r", "--out", str(out), "--scale-rewards", "batch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "trl-ext: error: this option would change nothing: --scale-rewards acts only with "
        "advantage_estimator 'grpo' (this run's: 'gae'); drop it"
    ]
    assert not out.exists()
    with pytest.raises(InputError, match="--vllm-gpu-memory-utilization acts only with the vllm sampler colocated"):
        _options("ppo", [*PPO, "--sampler", "loop", "--vllm-gpu-memory-utilization", "0.5"])
    with pytest.raises(InputError, match="these options would change nothing: --kl-horizon .*; drop them"):
        _options("ppo", [*PPO, "--kl-horizon", "50", "--save-total-limit", "2"])


def test_a_yaml_option_is_named_as_the_file_gives_it(tmp_path):
    (tmp_path / "run.yaml").write_text("save_total_limit: 2\n")
    with pytest.raises(InputError, match=r"save_total_limit \(config file\) acts only with save_steps > 0"):
        _options("ppo", [*PPO, "--config", str(tmp_path / "run.yaml")])


def test_a_value_the_run_had_anyway_is_no_mistake():
    # recipes/doubling/ppo.yaml repeats the command's defaults (vf_coef 0.5, a separate critic): a GRPO run takes it
    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "doubling" / "ppo.yaml")
    opts = _options("ppo", ["--config", recipe, "--backend", "scratch-grpo", "--separate-critic", "true"])
    assert opts.train.advantage_estimator == "grpo" and opts.sources["vf_coef"] == "yaml"


def test_what_defaults_and_presets_set_is_theirs_and_the_preset_decides_the_scope():
    # the doubling commands set separate_critic and vf_coef; scratch-grpo's preset sets no critic: no refusal
    opts = _options("ppo", [*PPO, "--backend", "scratch-grpo", "--scale-rewards", "none"])
    assert opts.train.advantage_estimator == "grpo" and opts.train.separate_critic
    with pytest.raises(InputError, match="--vf-coef acts only with an estimator that has a critic"):
        _options("ppo", [*PPO, "--backend", "scratch-grpo", "--vf-coef", "0.3"])


def test_a_trl_trainers_run_takes_what_it_reads_not_judged_by_the_scratch_trainers_scopes():
    assert _options("ppo", [*PPO, "--backend", "grpo", "--scale-rewards", "none", "--beta", "0.1"])
    checkpoints = ["--save-steps", "5", "--save-total-limit", "2"]
    assert _options("ppo", [*PPO, "--backend", "trl", "--vf-coef", "0.3", *checkpoints])
    rlhf = ["--policy", "p", "--prompts", "x", "--out", "o"]
    assert _options("rlhf", [*rlhf, "--backend", "trl", "--dtype", "bfloat16"])  # rlhf loads its models in it


def test_what_a_trl_trainer_fixes_is_named_with_its_value():
    from trl_ext.runs.runners import inert_options as runner_inert

    # the doubling command keeps the eos for its classifier; TRL's GRPO strips it (a value, not an option, of TRL's)
    assert runner_inert("grpo", PPOConfig(skip_special_tokens=False), ["skip_special_tokens"]) == {
        "skip_special_tokens": "backend 'scratch' (TRL's GRPO runs True)"
    }


@pytest.mark.parametrize(
    "command, backend, option, value, acts_with",
    [
        ("ppo", "grpo", "--vf-coef", "0.3", "backend 'scratch' (TRL's GRPO never reads it)"),
        ("ppo", "trl", "--num-generations", "4", "backend 'scratch' (TRL's PPO never reads it)"),
        ("ppo", "rloo", "--chunked-lm-head", "true", "backend 'scratch' (TRL's RLOO never reads it)"),
        ("ppo", "rloo-tuned", "--scale-rewards", "batch", "backend 'scratch' (TRL's RLOO never reads it)"),
        ("ppo", "trl", "--beta", "0.1", "backend 'scratch' (TRL's PPO runs 0.0)"),
        ("ppo", "rloo", "--kl-mode", "token", "backend 'scratch' (TRL's RLOO runs 'sequence')"),
        ("ppo", "grpo", "--kl-coef", "0.1", "backend 'scratch' (TRL's GRPO runs 0.0)"),
        ("ppo", "trl", "--advantage-estimator", "grpo", "backend 'scratch' (TRL's PPO runs 'gae')"),
        ("rlhf", "trl", "--max-grad-norm", "1", "backend 'scratch' (TRL's PPO runs 0.0)"),
        ("ppo", "trl", "--save-total-limit", "2", "save_steps > 0"),
        ("ppo", "trl", "--dtype", "bfloat16", "backend 'scratch' (TRL's PPO never reads it)"),  # rlhf's does
        ("ppo", "trl", "--loss-type", "grpo", "backend 'scratch' (TRL's PPO runs 'bnpo')"),
    ],
)
def test_a_trl_trainers_run_refuses_what_it_never_reads_or_fixes_at_another_value(
    command, backend, option, value, acts_with
):
    args = PPO if command == "ppo" else ["--policy", "p", "--prompts", "x", "--out", "o"]
    with pytest.raises(InputError, match=re.escape(f"{option} acts only with {acts_with}; drop it")):
        _options(command, [*args, "--backend", backend, option, value])


def test_an_option_trls_grpo_reads_acts_as_in_ours_only_with_what_it_needs():
    """TRL's GRPO reads use_bias_correction_kl only with a KL loss term, as the scratch trainer does."""
    unweighted = [*PPO, "--backend", "grpo", "--use-bias-correction-kl", "false"]
    assert _options("ppo", [*unweighted, "--beta", "0.1"])
    with pytest.raises(InputError, match=re.escape("--use-bias-correction-kl acts only with beta > 0; drop it")):
        _options("ppo", [*unweighted, "--beta", "0"])


def test_compare_refuses_only_an_option_no_row_reads():
    _options("compare", ["--backends", "scratch,scratch-grpo", "--scale-rewards", "batch"])
    _options("compare", ["--backends", "scratch,grpo", "--scale-rewards", "batch"])  # TRL's GRPO reads it
    _options("compare", ["--backends", "scratch,trl", "--micro-batch-size", "2"])  # the scratch row reads it
    with pytest.raises(InputError, match="--micro-batch-size acts only with backend 'scratch'"):
        _options("compare", ["--backends", "trl,grpo", "--micro-batch-size", "2"])
    both = r"--cliprange-value acts only with backend 'scratch' \(TRL's GRPO never reads it\) or, in another row, an"
    with pytest.raises(InputError, match=both):  # each row's reason, once
        _options("compare", ["--backends", "grpo,scratch-grpo,grpo-tuned", "--cliprange-value", "0.3"])
    with pytest.raises(InputError, match="--scale-rewards acts only with"):
        _options("compare", ["--backends", "scratch", "--scale-rewards", "batch"])
    with pytest.raises(InputError, match="--max-tool-calling-iterations acts only with tools or an environment"):
        _options("demo", ["--max-tool-calling-iterations", "2"])


def test_rlhf_refuses_a_tool_call_bound_without_tools_before_any_stage(tmp_path):
    args = ["--policy", "p", "--prompts", "x.txt", "--out", str(tmp_path / "o"), "--max-tool-calling-iterations", "2"]
    with pytest.raises(InputError, match="--max-tool-calling-iterations acts only with tools or an environment"):
        _options("rlhf", args)
    with pytest.raises(InputError, match="--save-total-limit acts only with save_steps > 0"):
        _options("rlhf", [*args[:-2], "--save-total-limit", "2"])
    assert _options("rlhf", [*args[:-2], "--kl-horizon", "8"])  # the scratch preset's kl_target: it acts


def test_the_trainer_refuses_an_engine_option_for_an_engine_named_and_warns_where_auto_picked(tokenizer):
    from tests.test_extensions import _trainer

    with pytest.raises(InputError, match="vllm_gpu_memory_utilization acts only with the vllm sampler colocated"):
        _trainer(tokenizer, sampler="loop", vllm_gpu_memory_utilization=0.5)
    with pytest.warns(UserWarning, match=r"sampler 'loop'.*'auto' chose that engine on this machine"):
        _trainer(tokenizer, vllm_gpu_memory_utilization=0.5)


def test_a_single_turn_rollout_refuses_a_tool_call_bound(tokenizer):
    from tests.test_extensions import _trainer

    with pytest.raises(InputError, match="max_tool_calling_iterations bounds the tool calls of a multi-turn"):
        _trainer(tokenizer, max_tool_calling_iterations=2)


def test_inert_options_names_only_those_asked_about():
    assert inert_options(PPOConfig(), ["scale_rewards", "learning_rate"]) == {
        "scale_rewards": "advantage_estimator 'grpo' (this run's: 'gae')"
    }


def test_an_unknown_yaml_key_names_the_nearest_options(tmp_path):
    (tmp_path / "a.yaml").write_text("learning_rat: 0.1\n")
    with pytest.raises(
        InputError, match=r"unknown option 'learning_rat' \(did you mean learning_rate or critic_learning_rate\?\)"
    ):
        _options("ppo", [*PPO, "--config", str(tmp_path / "a.yaml")])
    (tmp_path / "b.yaml").write_text("zzqqxx: 1\n")
    with pytest.raises(InputError, match=r"unknown option 'zzqqxx' \(`--help` lists the options\)"):
        _options("ppo", [*PPO, "--config", str(tmp_path / "b.yaml")])


def test_a_compare_report_names_what_trls_group_trainers_run_otherwise_than_their_rows_settings():
    """The doubling commands keep the eos for their classifier; TRL's GRPO decodes without special tokens, so its
    row's report says so, and a row of ours at the same preset has nothing to say."""
    from trl_ext.tasks.doubling.pipeline import group_trainer_notes

    opts = _options("compare", ["--out", "o", "--backends", "grpo,scratch-grpo"])
    assert group_trainer_notes(opts) == [
        "grpo: where TRL's GRPO has no choice it differs from the row's settings in skip_special_tokens "
        "(ours False, TRL's True)."
    ]
    opts = _options("compare", ["--out", "o", "--backends", "grpo", "--skip-special-tokens", "true"])
    assert group_trainer_notes(opts) == []


def test_a_flag_gives_none_to_an_option_that_takes_it():
    opts = _options("ppo", [*PPO, "--cliprange-value", "none", "--critic-learning-rate", "1e-2"])
    assert opts.train.cliprange_value is None and opts.sources["cliprange_value"] == "flag"
    assert opts.train.critic_learning_rate == 1e-2
    assert _options("ppo", PPO).train.cliprange_value == 0.2  # not given: the default
    with pytest.raises(argparse.ArgumentError, match="invalid float value: 'none'"):
        _options("ppo", [*PPO, "--learning-rate", "none"])  # an option that takes no None
