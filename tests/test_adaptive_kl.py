"""The adaptive KL controller (``kl_target``): its formula, the trainer moving the KL weight toward the target
and saving it across a resume, and the backends that cannot adapt refusing the option."""

import json

import pytest

from trl_ext.errors import InputError
from trl_ext.ppo import PPOConfig, PPOTrainer
from trl_ext.ppo.core import adaptive_kl_coef
from trl_ext.runs.runners import check_runnable
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config


def test_adaptive_kl_coef_by_hand():
    # Ziegler et al.: a proportional error clipped to +-0.2, scaled by the update's episodes over the horizon.
    assert adaptive_kl_coef(0.1, observed_kl=6.0, target=6.0, horizon=100, episodes=10) == pytest.approx(0.1)
    assert adaptive_kl_coef(0.1, observed_kl=6.6, target=6.0, horizon=100, episodes=10) == pytest.approx(0.1 * 1.01)
    assert adaptive_kl_coef(0.1, observed_kl=60.0, target=6.0, horizon=100, episodes=10) == pytest.approx(0.1 * 1.02)
    assert adaptive_kl_coef(0.1, observed_kl=0.0, target=6.0, horizon=100, episodes=10) == pytest.approx(0.1 * 0.98)
    # An update larger than the horizon moves the weight by 20% at most, never to zero or below.
    assert adaptive_kl_coef(0.1, observed_kl=0.0, target=6.0, horizon=32, episodes=256) == pytest.approx(0.1 * 0.8)
    assert adaptive_kl_coef(0.1, observed_kl=60.0, target=6.0, horizon=32, episodes=256) == pytest.approx(0.1 * 1.2)


def test_bad_kl_target_is_refused_by_name():
    with pytest.raises(InputError, match="kl_target needs a positive target and a positive starting kl_coef"):
        PPOConfig(kl_target=0.0)
    with pytest.raises(InputError, match="kl_target needs .* got kl_target=1.0, kl_coef=0"):
        PPOConfig(kl_target=1.0, kl_coef=0)
    with pytest.raises(InputError, match="kl_horizon"):
        PPOConfig(kl_target=1.0, kl_horizon=0)


@pytest.mark.parametrize("runner", ["trl", "grpo", "rloo"])
def test_backends_with_a_fixed_kl_weight_refuse_kl_target(runner):
    with pytest.raises(InputError, match=f"--kl-target adapts the scratch trainer's KL weight; backend '{runner}'"):
        check_runnable(runner, PPOConfig(kl_target=1.0))


def _trainer(tokenizer, out, **options):
    from datasets import Dataset

    from trl_ext.tasks.doubling.models import build_policy

    data = Dataset.from_dict({"input_ids": [tokenizer("S数字:1234x2=")["input_ids"]] * 32})
    args = doubling_ppo_config(
        **{
            "batch_size": 4,
            "total_episodes": 16,
            "num_ppo_epochs": 2,
            "learning_rate": 1e-3,
            "output_dir": str(out),
            **options,
        }
    )
    return PPOTrainer(
        build_policy(tokenizer),
        lambda completions, **kw: [float(len(c)) for c in completions],
        args=args,
        processing_class=tokenizer,
        train_dataset=data,
    )


def test_trainer_moves_the_kl_weight_toward_the_target_and_resumes_it(tokenizer, tmp_path):
    # Each update's weight is the controller's step from the last one, on the KL that update logged: it falls
    # after the first update (policy = reference, KL 0, below any target) and rises after every update whose KL
    # is above the tiny target. A resume goes on from the saved weight; a fixed weight never moves.
    trainer = _trainer(tokenizer, tmp_path, kl_coef=0.2, kl_target=1e-3, kl_horizon=8, save_steps=2)
    history = trainer.train()
    weights, kls = [h["objective/kl_coef"] for h in history], [float(h["objective/kl"]) for h in history]
    assert weights[0] == 0.2 and kls[0] == pytest.approx(0.0, abs=1e-6)
    for before, after, kl in zip(weights, weights[1:], kls):
        assert after == pytest.approx(adaptive_kl_coef(before, kl, 1e-3, 8, 4))
        assert (after > before) == (kl > 1e-3)
    assert any(kl > 1e-3 for kl in kls[1:-1])  # the rise was exercised
    state = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["kl_coef"] == pytest.approx(trainer.kl_coef)
    resumed = _trainer(
        tokenizer,
        tmp_path,
        kl_coef=0.2,
        kl_target=1e-3,
        kl_horizon=8,
        resume_from_checkpoint=str(tmp_path / "checkpoint-2"),
    )
    assert resumed.kl_coef == pytest.approx(weights[2])
    fixed_resume = _trainer(tokenizer, tmp_path, kl_coef=0.3, resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert fixed_resume.kl_coef == 0.3  # a fixed weight is the resumed run's own --kl-coef
    fixed = _trainer(tokenizer, tmp_path / "fixed", kl_coef=0.2).train()
    assert {h["objective/kl_coef"] for h in fixed} == {0.2}
