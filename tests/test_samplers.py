"""The rollout interface: every engine behind ``Sampler.sample``, and what the trainer does with an engine's
own log-probs (the sampling/training gap's metrics and TRL's truncated importance-sampling correction)."""

import math

import pytest
import torch
from datasets import Dataset

from trl_ext.ppo import PPOConfig, core, losses
from trl_ext.ppo.rollout.samplers import (
    SAMPLERS,
    Completions,
    LoopSampler,
    SamplingOptions,
    build_sampler,
    resolve_sampler,
)
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config


def _length(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _prompts(tokenizer, n=8):
    return Dataset.from_dict({"input_ids": [tokenizer(f"S数字:{1000 + 7 * i}x2=")["input_ids"] for i in range(n)]})


MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_truncate_clamps_each_tokens_ratio():
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.1, 0.4, 0.3]]))
    sampler = torch.log(torch.tensor([[0.5, 0.8, 0.1], [0.4, 0.1, 0.7]]))
    weights = core.importance_sampling_weights(trainer, sampler, MASK, "token_truncate", None, 3.0)
    expected = torch.tensor([[1.0, 0.25, 3.0], [0.25, 3.0, 1.0]])  # 9 and 4 capped at 3; the padded token: ratio 1
    assert torch.allclose(weights, expected, atol=1e-6)
    low = core.importance_sampling_weights(trainer, sampler, MASK, "token_truncate", 0.5, 3.0)
    assert torch.allclose(low, expected.clamp(min=0.5), atol=1e-6)


def test_token_mask_zeroes_ratios_outside_the_bounds():
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.1, 0.4, 0.3]]))
    sampler = torch.log(torch.tensor([[0.5, 0.8, 0.1], [0.4, 0.1, 0.7]]))
    weights = core.importance_sampling_weights(trainer, sampler, MASK, "token_mask", 0.3, 3.0)
    assert torch.allclose(weights, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]), atol=1e-6)


def test_sequence_modes_use_one_ratio_per_row_from_the_masked_sum():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -50.0]])
    sampler = torch.tensor([[-1.5, -2.0, -3.0], [-2.0, -2.0, 0.0]])  # row 1's last token is padding
    truncated = core.importance_sampling_weights(trainer, sampler, MASK, "sequence_truncate", None, 3.0)
    assert truncated.shape == (2, 1)
    assert torch.allclose(truncated[:, 0], torch.tensor([math.exp(0.5), 3.0]), atol=1e-6)  # e^2 capped at 3
    masked = core.importance_sampling_weights(trainer, sampler, MASK, "sequence_mask", None, 3.0)
    assert torch.allclose(masked[:, 0], torch.tensor([math.exp(0.5), 0.0]), atol=1e-6)


def test_importance_weights_scale_the_surrogate_not_the_kl_term():
    from types import SimpleNamespace

    cfg = SimpleNamespace(
        policy_loss="clip",
        policy_loss_kwargs=None,
        cliprange_high=None,
        cliprange=0.2,
        beta=0.0,
        loss_type="bnpo",
        response_length=3,
        kl_loss_estimator="k3",
        use_bias_correction_kl=True,
    )
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.1, 0.4, 0.3]])).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 0.5], [2.0, 1.0, 0.0]])
    plain, _ = losses.policy_loss(logp, logp.detach(), logp.detach(), adv, MASK, cfg)
    ones, _ = losses.policy_loss(logp, logp.detach(), logp.detach(), adv, MASK, cfg, torch.ones(2, 1))
    doubled, _ = losses.policy_loss(logp, logp.detach(), logp.detach(), adv, MASK, cfg, torch.full((2, 3), 2.0))
    assert ones.item() == pytest.approx(plain.item()) and doubled.item() == pytest.approx(2 * plain.item())


AUTO = PPOConfig()  # sampler 'auto', no top-k/top-p


def test_auto_is_the_loop_on_cpu_the_static_sampler_on_a_gpu_and_every_engine_is_registered():
    assert resolve_sampler(AUTO, torch.device("cpu")) == "loop"
    assert resolve_sampler(AUTO, torch.device("cuda")) == "static"  # measured fastest on a GPU (rlhf-gpu.json)
    assert resolve_sampler(PPOConfig(sampler="static"), torch.device("cpu")) == "static"
    for device in ("cpu", "cuda"):  # a server asked for is the engine wherever the trainer runs
        assert resolve_sampler(PPOConfig(vllm_mode="server"), torch.device(device)) == "vllm"
    assert {"loop", "generate", "static", "vllm"} <= set(SAMPLERS)  # and whatever user code registered
    assert isinstance(build_sampler("loop"), LoopSampler)


def _qwen2(hidden: int, heads: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=hidden,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=heads,
            num_key_value_heads=heads,
        )
    )


def test_auto_keeps_the_loop_on_cpu_for_a_small_policy_or_without_vllm(monkeypatch):
    from trl_ext.ppo.rollout import samplers, vllm_sampler

    policy = _qwen2(64, 2)  # heads of 32, which vLLM's CPU attention runs
    assert resolve_sampler(AUTO, torch.device("cpu"), policy) == "loop"  # far below 100M parameters
    monkeypatch.setattr(samplers, "VLLM_CPU_MIN_PARAMETERS", 0)
    monkeypatch.setattr(vllm_sampler, "vllm_installed", lambda: False)
    assert resolve_sampler(AUTO, torch.device("cpu"), policy) == "loop"
    assert resolve_sampler(AUTO, torch.device("cuda"), policy) == "static"


@pytest.mark.needs_vllm
def test_auto_picks_vllm_on_cpu_where_it_was_measured_to_win(monkeypatch):
    from trl_ext.ppo.rollout import samplers

    monkeypatch.setattr(samplers, "VLLM_CPU_MIN_PARAMETERS", 0)  # a tiny policy stands in for a 135M one
    assert resolve_sampler(AUTO, torch.device("cpu"), _qwen2(64, 2)) == "vllm"
    assert resolve_sampler(AUTO, torch.device("cpu"), _qwen2(64, 4)) == "loop"  # heads of 16: vLLM's CPU cannot
    assert resolve_sampler(PPOConfig(top_p=0.9), torch.device("cpu"), _qwen2(64, 2)) == "loop"  # not measured
    assert resolve_sampler(PPOConfig(top_k=5), torch.device("cpu"), _qwen2(64, 2)) == "loop"


class ShiftedLogprobs(LoopSampler):
    """The loop's samples, reported with the trainer's own log-probs minus ``shift`` (a stand-in for an
    engine whose numbers differ from the trainer's); counts ``policy_changed`` calls."""

    def __init__(self, shift: float, temperature: float):
        self.shift, self.temperature, self.changes = shift, temperature, 0

    def sample(self, model, query_ids, query_mask, options, generator=None):
        from trl_ext.data.sequences import positions_from_mask, response_mask

        ids = super().sample(model, query_ids, query_mask, options, generator).ids
        mask = torch.cat([query_mask, response_mask(ids, options.eos_token_id)], dim=1)
        with torch.no_grad():
            logits = model(
                torch.cat([query_ids, ids], 1), attention_mask=mask, position_ids=positions_from_mask(mask)
            ).logits[:, query_ids.shape[1] - 1 : -1]
        return Completions(ids, core.logprobs_from_logits(logits.float(), ids, self.temperature) - self.shift)

    def policy_changed(self):
        self.changes += 1


@pytest.mark.parametrize("correction", [False, True])
def test_the_trainer_logs_the_engines_gap_and_corrects_for_it(tokenizer, correction):
    from trl_ext.ppo import PPOTrainer
    from trl_ext.tasks.doubling.models import build_policy

    cfg = doubling_ppo_config(batch_size=4, total_episodes=4, num_ppo_epochs=2, num_mini_batches=2)
    trainer = PPOTrainer(
        build_policy(tokenizer, seed=3),
        _length,
        processing_class=tokenizer,
        train_dataset=_prompts(tokenizer),
        args=cfg,
    )
    # set after construction: the trainer refuses the correction for an engine that returns no log-probs
    trainer.config.vllm_importance_sampling_correction = correction
    trainer.sampler = engine = ShiftedLogprobs(0.1, cfg.temperature)
    (stats,) = trainer.train()
    assert stats["sampling/sampling_logp_difference/mean"] == pytest.approx(0.1, abs=1e-5)
    assert stats["sampling/sampling_logp_difference/max"] == pytest.approx(0.1, abs=1e-5)
    assert engine.changes == 4  # one per optimizer step: 2 epochs x 2 minibatches
    if correction:  # token_truncate, cap 3: every ratio is e^0.1
        for name in ("min", "mean", "max"):
            assert stats[f"sampling/importance_sampling_ratio/{name}"] == pytest.approx(math.exp(0.1), abs=1e-4)
    else:
        assert not any(k.startswith("sampling/importance") for k in stats)


def test_the_correction_is_a_config_choice_for_any_engine():
    """Whether the engine returns log-probs is known once it is built (tests/test_extensions.py)."""
    from trl_ext.ppo import PPOConfig

    assert PPOConfig(vllm_importance_sampling_correction=True, sampler="auto").vllm_importance_sampling_correction


def test_every_engine_returns_pad_after_eos(tokenizer):
    from trl_ext.tasks.doubling.models import build_policy

    policy = build_policy(tokenizer, seed=3).eval()
    from trl_ext.data.batching import pad_batch

    ids, mask = pad_batch(
        [tokenizer(f"S数字:{1000 + 7 * i}x2=")["input_ids"] for i in range(4)], tokenizer.pad_token_id, side="left"
    )
    options = SamplingOptions(
        max_new_tokens=8, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, temperature=1.0
    )
    for name in ("loop", "generate", "static"):
        out = build_sampler(name).sample(policy, ids, mask, options, torch.Generator().manual_seed(0))
        assert out.logprobs is None and out.ids.shape[0] == 4 and out.ids.shape[1] <= 8
        ended = (out.ids == tokenizer.eos_token_id).long().cumsum(1)
        after = (ended - (out.ids == tokenizer.eos_token_id).long()) > 0
        assert (out.ids[after] == tokenizer.pad_token_id).all(), name
