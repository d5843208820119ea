"""Extension points open to user code: a sampler, an advantage estimator, a policy loss with its own settings and
a KL shaping, each in one file of the user's (recipes/extensions/), named as 'file.py:name' from PPOConfig and the
command line, checked against the live registries."""

import argparse
import warnings
from pathlib import Path

import pytest

from trl_ext.errors import InputError
from trl_ext.ppo import PPOConfig, core
from trl_ext.ppo.advantages import ADVANTAGE_ESTIMATORS
from trl_ext.ppo.losses import POLICY_LOSSES
from trl_ext.ppo.rollout.samplers import SAMPLERS

ROOT = Path(__file__).resolve().parents[1]
OURS = str(ROOT / "recipes" / "extensions")


def test_each_kind_is_named_from_a_user_file_and_found_under_its_registered_name_too():
    cfg = PPOConfig(
        sampler=f"{OURS}/generate_with_logprobs.py:GenerateWithLogprobs",
        advantage_estimator=f"{OURS}/median_baseline.py:median_baseline",
        policy_loss=f"{OURS}/clip_higher.py:clip_higher",
        policy_loss_kwargs={"cliprange_high": 0.3},
        kl_mode=f"{OURS}/mean_kl.py:mean_kl",
        num_generations=2,
    )
    for registry, spec, name in (
        (SAMPLERS, cfg.sampler, "generate_with_logprobs"),
        (ADVANTAGE_ESTIMATORS, cfg.advantage_estimator, "median_baseline"),
        (POLICY_LOSSES, cfg.policy_loss, "clip_higher"),
        (core.KL_SHAPINGS, cfg.kl_mode, "mean_kl"),
    ):
        assert registry[spec] is registry[name]  # the file ran once: its decorator registered the name


def test_a_function_the_file_does_not_register_gets_the_registrys_defaults(tmp_path):
    (tmp_path / "plain.py").write_text("def half(scores, kl, mask, kl_coef):\n    return kl * 0, kl * 0\n")
    spec = f"{tmp_path / 'plain.py'}:half"
    entry = core.KL_SHAPINGS[spec]
    assert entry.fn.__name__ == "half" and core.KL_SHAPINGS[spec] is entry
    assert spec not in list(core.KL_SHAPINGS)  # the registered names stay the ones a decorator gave


def test_a_name_registered_after_import_is_a_choice_at_once():
    from trl_ext.ppo.rollout.samplers import LoopSampler

    with pytest.raises(InputError, match="unknown sampler 'late_loop'"):
        PPOConfig(sampler="late_loop")
    SAMPLERS.register("late_loop")(type("LateLoop", (LoopSampler,), {}))
    assert PPOConfig(sampler="late_loop").sampler == "late_loop"  # the live registry, not a copy made at import


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_module_here:fn", "cannot import 'no_such_module_here'"),
        ("missing_file.py:fn", "file 'missing_file.py' does not exist"),
        (f"{OURS}/clip_higher.py:no_such_loss", "has no callable 'no_such_loss'"),
    ],
)
def test_user_code_that_does_not_resolve_is_one_error_naming_it(spec, message):
    with pytest.raises(InputError, match=message):
        PPOConfig(policy_loss=spec)


def test_policy_loss_kwargs_are_checked_against_the_losss_signature():
    loss = f"{OURS}/clip_higher.py:clip_higher"
    with pytest.raises(InputError, match=r"policy_loss_kwargs \['clip_high'\]: policy loss .* takes cliprange_high"):
        PPOConfig(policy_loss=loss, policy_loss_kwargs={"clip_high": 0.3})
    with pytest.raises(InputError, match="policy loss 'clip' takes cliprange_high"):
        PPOConfig(policy_loss="clip", policy_loss_kwargs={"clip_high": 0.3})
    with pytest.raises(InputError, match="takes no settings of its own"):
        PPOConfig(policy_loss="sequence_clip", policy_loss_kwargs={"cliprange_high": 0.3})
    with pytest.raises(InputError, match="cliprange_high is given twice"):
        PPOConfig(cliprange_high=0.28, policy_loss_kwargs={"cliprange_high": 0.3})
    with pytest.raises(InputError, match="must be a mapping"):
        PPOConfig(policy_loss=loss, policy_loss_kwargs=[0.3])


def test_a_required_setting_is_asked_for():
    @POLICY_LOSSES.register("needs_a_setting")
    def needs_a_setting(logprobs, old_logprobs, advantages, mask, cliprange, *, tau):
        return advantages, {}

    with pytest.raises(InputError, match=r"needs policy_loss_kwargs \['tau'\]"):
        PPOConfig(policy_loss="needs_a_setting")
    assert PPOConfig(policy_loss="needs_a_setting", policy_loss_kwargs={"tau": 1.0}).policy_loss_kwargs == {"tau": 1.0}


def test_the_loss_receives_its_settings():
    import torch

    from trl_ext.ppo.losses import policy_loss

    cfg = PPOConfig(policy_loss=f"{OURS}/clip_higher.py:clip_higher", policy_loss_kwargs={"cliprange_high": 10.0})
    logprobs, old = torch.log(torch.tensor([[0.9]])), torch.log(torch.tensor([[0.3]]))  # ratio 3
    advantages, mask = torch.ones(1, 1), torch.ones(1, 1)
    loss, stats = policy_loss(logprobs, old, old, advantages, mask, cfg)
    assert loss.item() == pytest.approx(-3.0) and stats["clipfrac"].item() == 0  # within 1 + 10: not clipped
    loss, _ = policy_loss(logprobs, old, old, advantages, mask, PPOConfig())  # clip: 1 + 0.2
    assert loss.item() == pytest.approx(-1.2)


def test_the_command_line_names_user_code_and_takes_the_settings_as_json():
    from trl_ext.commands.cli import commands
    from trl_ext.commands.parsing import add_command_arguments, build_options

    ppo = commands()["ppo"]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_command_arguments(parser, ppo)
    args = [
        "--policy",
        "p",
        "--reward",
        "r",
        "--out",
        "o",
        "--policy-loss",
        f"{OURS}/clip_higher.py:clip_higher",
        "--policy-loss-kwargs",
        '{"cliprange_high": 0.28}',
        "--kl-mode",
        f"{OURS}/mean_kl.py:mean_kl",
    ]
    opts = build_options(ppo, parser.parse_args(args))
    assert opts.train.policy_loss_kwargs == {"cliprange_high": 0.28}
    assert opts.train.kl_mode.endswith("mean_kl.py:mean_kl")
    with pytest.raises(argparse.ArgumentError, match="expected a JSON object"):
        parser.parse_args([*args[:-4], "--policy-loss-kwargs", "0.28"])


def _trainer(tokenizer, **options):
    from trl_ext.ppo import PPOTrainer
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.rewards import CharsetCompliance
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    cfg = PPOConfig(batch_size=4, total_episodes=4, response_length=6, **options)
    return PPOTrainer(
        build_policy(tokenizer),
        reward_funcs=CharsetCompliance(),
        args=cfg,
        train_dataset=ppo_prompt_dataset(tokenizer, 8, seed=0),
        processing_class=tokenizer,
    )


def test_the_correction_is_refused_for_an_engine_named_that_returns_no_log_probs(tokenizer):
    with pytest.raises(InputError, match="sampler 'loop' returns none"):
        _trainer(tokenizer, sampler="loop", vllm_importance_sampling_correction=True)


def test_the_correction_warns_where_auto_picked_an_engine_without_log_probs(tokenizer):
    with pytest.warns(UserWarning, match="'auto' chose that engine on this machine"):
        _trainer(tokenizer, vllm_importance_sampling_correction=True)


def test_the_correction_applies_to_any_engine_that_returns_log_probs(tokenizer):
    trainer = _trainer(
        tokenizer,
        sampler=f"{OURS}/generate_with_logprobs.py:GenerateWithLogprobs",
        vllm_importance_sampling_correction=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (stats,) = trainer.train()
    assert stats["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-3)  # same weights
    assert stats["sampling/sampling_logp_difference/max"] < 1e-3


def test_a_module_in_the_current_folder_imports_as_python_m_finds_it(tmp_path, monkeypatch):
    """The installed ``trl-ext`` script's ``sys.path`` lacks the current folder, where ``python -m`` has it."""
    import sys

    from trl_ext.settings.user_code import import_callable

    (tmp_path / "beside_the_user.py").write_text("def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert import_callable("beside_the_user:score", "reward function")(["a", "b"]) == [1.0, 1.0]
        assert sys.path[-1] == str(tmp_path)  # appended: an installed package of the same name comes first
    finally:
        sys.modules.pop("beside_the_user", None)
