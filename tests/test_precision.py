"""The dtype policy: bf16 / fp16 checkpoints with real vocabulary sizes load and train; trainable weights
are float32 masters, frozen ones keep the checkpoint's dtype; a dtype the device lacks is one line."""

import math

import pytest
import torch
from datasets import Dataset
from tiny_models import DEBERTA_V2_VOCAB, QWEN2_VOCAB, tiny_deberta_reward, tiny_qwen2

from trl_ext.ppo import PPOConfig, PPOTrainer, precision


@pytest.fixture(scope="module")
def bf16_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    return (
        tiny_qwen2(root / "qwen2", vocab_size=QWEN2_VOCAB, dtype=torch.bfloat16),
        tiny_deberta_reward(root / "deberta", vocab_size=DEBERTA_V2_VOCAB, dtype=torch.bfloat16),
    )


def _dataset(n=4):
    return Dataset.from_dict({"prompt": [f"say {i}" for i in range(n)]})


def _trainer(policy, reward, **options):
    cfg = PPOConfig(
        batch_size=2,
        total_episodes=2,
        response_length=4,
        num_ppo_epochs=1,
        learning_rate=1e-2,
        **options.pop("config", {}),
    )
    return PPOTrainer(str(policy), str(reward), args=cfg, train_dataset=_dataset(), **options)


def _dtypes(module, trainable):
    return {p.dtype for p in module.parameters() if p.requires_grad == trainable}


def test_bf16_checkpoint_trains_with_float32_masters_and_a_bf16_reference(bf16_models):
    policy, reward = bf16_models
    trainer = _trainer(policy, reward)
    assert trainer.compute_dtype == torch.bfloat16
    assert _dtypes(trainer.actor_critic, trainable=True) == {torch.float32}  # policy and value head
    assert _dtypes(trainer.ref_policy, trainable=False) == {torch.bfloat16}  # frozen: the checkpoint's
    assert trainer.reward_funcs[0].model.dtype == torch.bfloat16  # the reward model scores in bf16
    before = trainer.actor_critic.value_head.weight.detach().clone()
    history = trainer.train()
    assert len(history) == 1 and all(math.isfinite(v) for v in history[0].values() if isinstance(v, float))
    assert not torch.equal(before, trainer.actor_critic.value_head.weight)


def test_bf16_lora_base_stays_bf16_and_adapters_train_in_float32(bf16_models):
    from peft import LoraConfig

    policy, reward = bf16_models
    trainer = _trainer(
        policy, reward, peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    assert _dtypes(trainer.actor_critic, trainable=True) == {torch.float32}
    assert _dtypes(trainer.actor_critic, trainable=False) == {torch.bfloat16}  # no float32 copy of the base
    before = {n: p.detach().clone() for n, p in trainer.actor_critic.named_parameters()}
    history = trainer.train()
    assert math.isfinite(history[0]["loss/value_avg"])
    after = dict(trainer.actor_critic.named_parameters())
    frozen = [n for n, p in after.items() if not p.requires_grad]
    assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)  # the bf16 base, bit for bit
    assert any(not torch.equal(before[n], p) for n, p in after.items() if "lora_" in n)  # the adapters learnt


def test_dtype_option_loads_the_checkpoint_in_the_dtype_asked(bf16_models):
    policy, reward = bf16_models
    trainer = _trainer(policy, reward, config={"dtype": "float32"})
    assert trainer.compute_dtype == torch.float32 and _dtypes(trainer.ref_policy, trainable=False) == {torch.float32}
    assert trainer.reward_funcs[0].model.dtype == torch.float32
    with pytest.raises(ValueError, match="dtype must be one of auto, bfloat16, float16, float32"):
        PPOConfig(dtype="half")


def test_an_op_the_device_lacks_in_the_dtype_is_one_line_naming_it(tmp_path):
    """fp16 runs on this CPU; an op without a Half kernel (a linear solve) stands in for one that lacks it."""
    policy = tiny_qwen2(tmp_path / "qwen2", dtype=torch.float16)
    trainer = PPOTrainer(
        str(policy),
        lambda completions, **kw: [1.0] * len(completions),
        train_dataset=_dataset(),
        args=PPOConfig(batch_size=2, total_episodes=2, response_length=2, num_ppo_epochs=1),
    )
    eye = torch.eye(2, dtype=torch.float16)
    trainer.policy.model.norm.register_forward_hook(lambda module, args, out: torch.linalg.inv(eye))
    with pytest.raises(ValueError) as caught:
        trainer.train()
    message = str(caught.value)
    assert "no float16 kernel on cpu" in message and "--dtype float32" in message and "\n" not in message


def test_bf16_on_a_gpu_without_it_is_refused_naming_the_way_out(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100")
    with pytest.raises(ValueError, match="cannot run bfloat16.*--dtype float16 or --dtype float32"):
        precision.check_device_supports(torch.bfloat16, torch.device("cuda"))
    precision.check_device_supports(torch.bfloat16, torch.device("cpu"))  # CPUs run bf16


def test_sharded_models_get_one_dtype():
    from torch import nn

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)).to(torch.bfloat16)
    model[0].requires_grad_(False)
    precision.float32_master_weights(model)
    assert (model[0].weight.dtype, model[1].weight.dtype) == (torch.bfloat16, torch.float32)
    precision.float32_master_weights(model, uniform=True)  # FSDP/DeepSpeed flatten parameters: one dtype
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_trl_trainers_take_the_launch_precision(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert precision.launch_training_arguments() == {
        "bf16": True,
        "fp16": False,
        "use_cpu": not torch.cuda.is_available(),
    }
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    assert precision.launch_training_arguments()["bf16"] is False
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    with pytest.raises(ValueError, match="ACCELERATE_MIXED_PRECISION='fp8'"):
        precision.launch_training_arguments()
