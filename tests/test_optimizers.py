"""The optimizer choice (``optim``): torch's AdamW, or torchao's 8-bit AdamW, whose moments take a quarter of the
memory; refused in one line where it cannot be built; trained with, checkpointed and resumed by the scratch
trainer, and passed on to TRL's trainers."""

import pytest
import torch

from trl_ext.errors import InputError
from trl_ext.ppo import PPOConfig
from trl_ext.ppo.optimizers import build_optimizer, check_optimizer, optimizer_state_bytes, optimizer_training_argument


def test_an_unknown_or_uninstalled_optimizer_is_one_line(monkeypatch):
    with pytest.raises(InputError, match="optim must be one of adamw_torch_fused, adamw_torch_8bit, got 'sgd'"):
        PPOConfig(optim="sgd")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(InputError, match="optim='adamw_torch_8bit' needs the torchao package: pip install torchao"):
        PPOConfig(optim="adamw_torch_8bit")
    check_optimizer("adamw_torch_fused")  # torch's own needs nothing


OPTIMS = ("adamw_torch_fused", "adamw_torch_8bit")


def test_8bit_adamw_steps_as_adamw_does_in_a_quarter_of_the_moment_memory():
    """Same start, same gradients: after five steps each weight has moved as float32 AdamW moved it (to a tenth of
    the movement), while the state takes at most 0.3x float32's bytes."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(256, 64), torch.nn.Linear(256, 64)]
    models[1].load_state_dict(models[0].state_dict())
    start = models[0].weight.detach().clone()
    optimizers = [build_optimizer(m, 1e-2, torch.device("cpu"), optim) for m, optim in zip(models, OPTIMS)]
    inputs, targets = torch.randn(32, 256), torch.randn(32, 64)
    for _ in range(5):
        for model, optimizer in zip(models, optimizers):
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()
    moved_fp32, moved_8bit = (m.weight.detach() - start for m in models)
    assert moved_fp32.abs().mean() > 1e-2  # five steps of about lr each
    assert (moved_8bit - moved_fp32).abs().mean() < 0.1 * moved_fp32.abs().mean()
    fp32_bytes = optimizer_state_bytes(optimizers[0])
    assert fp32_bytes >= 2 * 4 * (256 * 64 + 64)  # two float32 moments a weight
    assert optimizer_state_bytes(optimizers[1]) <= 0.3 * fp32_bytes  # the 64 biases' moments stay float32
    assert type(optimizers[1]).__name__ == "AdamW8bit"


def test_the_scratch_trainer_trains_checkpoints_and_resumes_with_8bit_adamw(tokenizer, tmp_path):
    """Four updates in one go, and two then two more from the checkpoint: the same weights (the moments saved and
    read back with ``weights_only=True``)."""
    from tests.test_checkpoints import _trainer

    options = {"optim": "adamw_torch_8bit", "save_steps": 2, "lr_scheduler_type": "constant"}
    whole = _trainer(tokenizer, tmp_path / "whole", **options)
    start = {n: p.detach().clone() for n, p in whole.policy.named_parameters()}
    logs = whole.train()
    assert type(whole.optimizer.optimizer).__name__ == "AdamW8bit"
    assert any(hasattr(s["exp_avg"], "codes") for s in whole.optimizer.optimizer.state.values())  # 8-bit moments
    assert all(isinstance(row["lr"], float) for row in logs)
    ended = {n: p.detach().clone() for n, p in whole.policy.named_parameters()}
    assert any(not torch.equal(start[n], ended[n]) for n in ended)

    checkpoint = str(tmp_path / "whole" / "checkpoint-2")
    resumed = _trainer(tokenizer, tmp_path / "whole", resume_from_checkpoint=checkpoint, **options)
    assert resumed.update_index == 2
    resumed.train()
    for name, param in resumed.policy.named_parameters():
        torch.testing.assert_close(param.detach(), ended[name], rtol=0, atol=1e-6)


def test_trls_trainers_get_the_same_optimizer_by_its_transformers_name():
    from trl_ext.runs.group_trainers import group_trainer_arguments

    assert optimizer_training_argument("adamw_torch_fused") == {}  # transformers' default, so TRL's
    config = PPOConfig(optim="adamw_torch_8bit")
    assert group_trainer_arguments("grpo", config)["optim"] == "adamw_torch_8bit"


@pytest.mark.needs_trl_ppo
def test_trl_ppo_gets_the_same_optimizer(tmp_path):
    from trl_ext.trl_compat.backend import trl_ppo_config

    assert trl_ppo_config(PPOConfig(optim="adamw_torch_8bit"), tmp_path).optim == "adamw_torch_8bit"
