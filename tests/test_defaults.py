"""PPOConfig's defaults are a real LLM run's (TRL's); the doubling commands run the doubling task's tuned values."""

import dataclasses

import pytest

from trl_ext.commands import demo, ppo
from trl_ext.doubling.ppo_settings import DOUBLING_COMMAND_PPO, DOUBLING_PPO, doubling_ppo_config
from trl_ext.ppo.config import PPOConfig

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
        assert {k: command.defaults[k] for k in DOUBLING_COMMAND_PPO if k not in budget} == \
            {k: v for k, v in DOUBLING_COMMAND_PPO.items() if k not in budget}
    assert demo.DEMO.defaults["total_episodes"] == 9600 and ppo.COMMAND.defaults["total_episodes"] == 19200
    assert demo.DEMO.defaults["learning_rate"] == 1e-3 and ppo.COMMAND.defaults["learning_rate"] == 3e-4
    assert doubling_ppo_config(batch_size=4).learning_rate == 3e-4 and doubling_ppo_config(batch_size=4).batch_size == 4
