"""PPOConfig's defaults are a real LLM run's (TRL's); the doubling commands run the doubling task's tuned values."""

import dataclasses

import pytest

from trl_ext.commands import demo, ppo
from trl_ext.errors import InputError
from trl_ext.ppo.config import PPOConfig
from trl_ext.tasks.doubling.ppo_settings import DOUBLING_COMMAND_PPO, DOUBLING_PPO, doubling_ppo_config

# our name -> TRL's, where TRL's PPOConfig has the option under another name
RENAMED = {"batch_size": "per_device_train_batch_size"}
# options TRL's PPOConfig has whose default we do not take, and why
NOT_TRLS = {
    "max_grad_norm": "Trainer's 1.0, which TRL's PPO loop never applies",
    "gradient_checkpointing": "TRL's True costs time on small models; an opt-in here",
    "seed": "Trainer's 42; 0 here, as every seeded result in the README",
    "total_episodes": "TRL's None (epochs over the dataset); a number of rollouts here",
    "save_steps": "TRL's 500 saves checkpoints unasked",
    "save_total_limit": "TRL's None; 0 here means the same, keep all",
    "micro_batch_size": "TRL's is derived from its batch options (None until set); 0 here: sized like the passes",
    "local_rollout_forward_batch_size": "TRL's 64 rows; 0 here sizes the passes by the vocabulary (memory bound)",
}


@pytest.mark.needs_trl_ppo
def test_ppo_config_defaults_are_trls():
    from trl.experimental.ppo import PPOConfig as TRLPPOConfig

    trl_defaults = {f.name: f.default for f in dataclasses.fields(TRLPPOConfig)}
    compared = 0
    for f in dataclasses.fields(PPOConfig):
        name = RENAMED.get(f.name, f.name)
        if name in trl_defaults and f.name not in NOT_TRLS and f.name != "output_dir":
            assert f.default == trl_defaults[name], (f.name, f.default, trl_defaults[name])
            compared += 1
    assert compared >= 15  # learning rate, batch, epochs, KL, clip ranges, vf_coef, lengths, temperature, ...


def test_doubling_commands_run_the_doubling_values():
    defaults = PPOConfig()
    assert all(getattr(defaults, k) != v for k, v in DOUBLING_PPO.items())  # each one really differs
    for command in (ppo.COMMAND, demo.DEMO, demo.COMPARE):
        budget = ("total_episodes", "learning_rate")  # the demo's shorter run, and the rate that suits it
        assert {k: command.defaults[k] for k in DOUBLING_COMMAND_PPO if k not in budget} == {
            k: v for k, v in DOUBLING_COMMAND_PPO.items() if k not in budget
        }
    assert demo.DEMO.defaults["total_episodes"] == 9600 and ppo.COMMAND.defaults["total_episodes"] == 19200
    assert demo.DEMO.defaults["learning_rate"] == 1e-3 and ppo.COMMAND.defaults["learning_rate"] == 3e-4
    assert doubling_ppo_config(batch_size=4).learning_rate == 3e-4 and doubling_ppo_config(batch_size=4).batch_size == 4


def _options(command: str, *argv: str, config=None):
    """A command's options as the command line builds them."""
    import argparse

    from trl_ext.commands.cli import commands
    from trl_ext.commands.parsing import add_command_arguments, build_options

    parser = argparse.ArgumentParser()
    add_command_arguments(parser, commands()[command])
    return build_options(
        commands()[command], parser.parse_args(list(argv) + (["--config", str(config)] if config else []))
    )


DOUBLING_RUN = ("--policy", "p", "--reward", "r", "--out", "o")


def test_a_flag_holds_over_the_backend_preset_and_every_source_is_recorded(tmp_path):
    from trl_ext.tasks.doubling.presets import PRESETS

    (tmp_path / "run.yaml").write_text("num_ppo_epochs: 3\nbeta: 0.1\n")
    opts = _options(
        "ppo", *DOUBLING_RUN, "--backend", "scratch-grpo-quick", "--learning-rate", "1e-4", config=tmp_path / "run.yaml"
    )
    preset = PRESETS["grpo-quick"]
    assert (opts.train.learning_rate, opts.train.num_ppo_epochs, opts.train.beta) == (1e-4, 3, 0.1)
    assert {k: getattr(opts.train, k) for k in preset if k not in ("learning_rate", "num_ppo_epochs", "beta")} == {
        k: v for k, v in preset.items() if k not in ("learning_rate", "num_ppo_epochs", "beta")
    }
    sources = opts.sources
    assert (sources["learning_rate"], sources["num_ppo_epochs"], sources["kl_coef"]) == (
        "flag",
        "yaml",
        "preset grpo-quick",
    )
    assert (sources["response_length"], sources["cliprange"], sources["backend"]) == (
        "command default",
        "default",
        "flag",
    )


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_the_estimator_picks_its_doubling_preset(estimator):
    """``ppo --advantage-estimator grpo`` (or rloo) trains with that estimator's preset, not PPO's values
    (docs/decisions.md, "Defaults that fit the estimator")."""
    from trl_ext.tasks.doubling.presets import ESTIMATOR_PRESETS, PRESETS

    opts = _options(
        "ppo", *DOUBLING_RUN, "--advantage-estimator", estimator, "--num-generations", "4", "--total-episodes", "6400"
    )
    preset = PRESETS[ESTIMATOR_PRESETS[estimator]]
    expected = dataclasses.replace(
        PPOConfig(**{**ppo.COMMAND.defaults, **preset}), num_generations=4, total_episodes=6400
    )
    assert opts.train == expected
    assert opts.sources["learning_rate"] == f"preset {ESTIMATOR_PRESETS[estimator]}"
    plain = _options("ppo", *DOUBLING_RUN, "--backend", "trl")
    assert plain.train.learning_rate == ppo.COMMAND.defaults["learning_rate"]  # TRL's PPO takes no preset
    with pytest.raises(InputError, match="--advantage-estimator acts only with backend 'scratch'"):
        _options("ppo", *DOUBLING_RUN, "--advantage-estimator", estimator, "--backend", "trl")  # TRL's PPO: GAE


def test_compare_rows_take_their_preset_under_what_the_user_gave():
    from pathlib import Path

    from trl_ext.tasks.doubling.pipeline import PPORun, row_options
    from trl_ext.tasks.doubling.presets import PRESETS

    opts = _options("compare", "--out", "c", "--backends", "scratch,scratch-rloo-quick,rloo", "--learning-rate", "5e-4")
    rows = {
        b: row_options(opts, Path("c"), PPORun(b, "classifier", 1, b))
        for b in ("scratch", "scratch-rloo-quick", "rloo")
    }
    assert {b: r.train.learning_rate for b, r in rows.items()} == {b: 5e-4 for b in rows}  # the flag, every row
    assert rows["scratch"].train.advantage_estimator == "gae" and rows["scratch"].train.num_ppo_epochs == 4
    for backend, preset in (("scratch-rloo-quick", "rloo-quick"), ("rloo", "rloo")):
        train = rows[backend].train
        assert {k: getattr(train, k) for k in PRESETS[preset] if k != "learning_rate"} == {
            k: v for k, v in PRESETS[preset].items() if k != "learning_rate"
        }
        assert rows[backend].sources["policy_loss"] == f"preset {preset}" and train.seed == 1
