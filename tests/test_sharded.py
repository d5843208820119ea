"""Sharded models, mixed precision, sampling options and the PEFT reference of the scratch trainer, on CPU."""

import math
import warnings

import pytest
import torch
from datasets import Dataset
from launch import run_two_ranks

from trl_ext.ppo import PPOConfig, PPOTrainer, core
from trl_ext.ppo.rollout.interface import SamplingOptions
from trl_ext.ppo.rollout.loop import filter_logits, sample_responses
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config


def test_fsdp2_two_ranks_rollout_and_update_on_a_sharded_bf16_checkpoint():
    for r in run_two_ranks("fsdp2_two_ranks.py", "loop", "bf16"):  # ranks 0 and 1 of 2, which agree
        # each rank holds about half of the parameters, and they stay sharded
        assert abs(r["local"] / r["total"] - 0.5) < 0.05, r
        assert r["sharded_after"] and r["moved"] and r["updates"] == 2
        assert all(math.isfinite(s) for s in r["scores"])
        # a bf16 checkpoint: the sharded module is float32 throughout, the unsharded reference bf16
        assert r["dtypes"] == ["torch.float32"] and r["reference_dtype"] == "torch.bfloat16", r


@pytest.mark.trl_api  # TRL's ZeRO-3 hook removal
def test_deepspeed_zero3_two_ranks_rollout_and_update_on_a_partitioned_bf16_checkpoint():
    for r in run_two_ranks("zero3_two_ranks.py", "loop", "bf16", DS_ACCELERATOR="cpu"):
        # each rank holds half of every parameter; outside a forward nothing is whole
        assert abs(r["local"] / r["total"] - 0.5) < 0.01 and r["partitioned"], r
        assert r["moved"] and r["updates"] == 2 and all(math.isfinite(s) for s in r["scores"])
        assert r["dtypes"] == ["torch.float32"] and r["reference_dtype"] == "torch.bfloat16", r


def _prompts(tokenizer, n=8):
    return Dataset.from_dict({"input_ids": [tokenizer(f"S数字:{1000 + 7 * i}x2=")["input_ids"] for i in range(n)]})


def _length(completions, **kwargs):
    return [float(len(c)) for c in completions]


@pytest.fixture()
def fresh_accelerate_state():
    """accelerate keeps one process-wide state: a bf16 Accelerator would make every later one bf16 too."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_bf16_autocast_on_cpu_keeps_losses_float32(tokenizer, fresh_accelerate_state):
    from accelerate import Accelerator

    from trl_ext.tasks.doubling.models import build_policy

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    trainer = PPOTrainer(
        build_policy(tokenizer),
        _length,
        processing_class=tokenizer,
        accelerator=accelerator,
        args=doubling_ppo_config(batch_size=4, total_episodes=8, num_ppo_epochs=1),
        train_dataset=_prompts(tokenizer),
    )
    seen, losses, logprobs = [], [], []
    handle = trainer.policy.transformer.h[0].mlp.c_fc.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    backward, policy_pass = trainer.learner.hooks.backward, trainer.passes.policy_pass

    def recording_backward(loss):
        losses.append(loss.dtype)
        backward(loss)

    def recording_pass(*args, **kwargs):
        out = policy_pass(*args, **kwargs)
        logprobs.append(out.logprobs.dtype)
        return out

    trainer.learner.hooks.backward, trainer.passes.policy_pass = recording_backward, recording_pass
    history = trainer.train()
    handle.remove()
    assert torch.bfloat16 in seen  # the forward passes really ran in bf16
    assert losses and set(losses) == {torch.float32}  # every loss backpropagated is float32
    assert logprobs and set(logprobs) == {torch.float32}  # log-probs upcast before any loss reads them
    assert len(history) == 2 and all(math.isfinite(v) for h in history for v in h.values() if isinstance(v, float))


def test_gradient_checkpointing_updates(tokenizer, monkeypatch):
    """Updates with activation checkpointing: the blocks' forwards run again in the backward (counted at the MLP's
    forward: module hooks stay outside the checkpoint), and the updates equal those without it."""
    from transformers.models.gpt2 import modeling_gpt2

    from trl_ext.tasks.doubling.models import build_policy

    mlp_calls, mlp_forward = [0], modeling_gpt2.GPT2MLP.forward

    def counting_forward(self, *args, **kwargs):
        mlp_calls[0] += 1
        return mlp_forward(self, *args, **kwargs)

    monkeypatch.setattr(modeling_gpt2.GPT2MLP, "forward", counting_forward)

    with warnings.catch_warnings():  # switched on under the name the installed transformers takes (5.24 renamed it)
        warnings.filterwarnings("error", message=".*checkpointing.* is deprecated", category=FutureWarning)
        trainer = PPOTrainer(
            build_policy(tokenizer),
            _length,
            processing_class=tokenizer,
            train_dataset=_prompts(tokenizer),
            args=doubling_ppo_config(batch_size=4, total_episodes=8, num_ppo_epochs=1, gradient_checkpointing=True),
        )
    renamed = hasattr(type(trainer.policy), "is_activation_checkpointing")
    assert getattr(trainer.policy, "is_activation_checkpointing" if renamed else "is_gradient_checkpointing")
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    mlp_calls[0] = 0
    torch.manual_seed(0)
    history = trainer.train()
    with_checkpointing = mlp_calls[0]
    assert all(math.isfinite(h["loss/policy_avg"]) for h in history)
    assert any(not torch.equal(before[n], p) for n, p in trainer.policy.named_parameters())
    # the same updates as without checkpointing, from the same start and seed, with the blocks run again
    plain = PPOTrainer(
        build_policy(tokenizer),
        _length,
        processing_class=tokenizer,
        train_dataset=_prompts(tokenizer),
        args=doubling_ppo_config(batch_size=4, total_episodes=8, num_ppo_epochs=1),
    )
    plain.policy.load_state_dict({n: before[n] for n, _ in plain.policy.named_parameters()}, strict=False)
    mlp_calls[0] = 0
    torch.manual_seed(0)
    plain_history = plain.train()
    for with_gc, without in zip(history, plain_history, strict=True):
        numbers = [k for k, v in without.items() if isinstance(v, float) and not k.startswith(("timing/", "eps"))]
        assert {k: with_gc[k] for k in numbers} == pytest.approx({k: without[k] for k in numbers}, rel=1e-5, abs=1e-6)
    gap = max((p - q).abs().max().item() for p, q in zip(trainer.policy.parameters(), plain.policy.parameters()))
    layers = len(plain.policy.transformer.h)
    assert gap < 1e-6 and with_checkpointing == mlp_calls[0] + 2 * layers  # every block again, in each update


def test_peft_reference_is_the_base_model_with_adapters_off(tmp_path):
    from peft import LoraConfig
    from tiny_models import tiny_qwen2
    from transformers import AutoModelForCausalLM

    path = tiny_qwen2(tmp_path / "qwen2")
    trainer = PPOTrainer(
        str(path),
        _length,
        processing_class=None,
        args=doubling_ppo_config(batch_size=2, total_episodes=2, response_length=4, learning_rate=1e-1),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    assert trainer.ref_policy is None  # no second copy of the base model
    base = AutoModelForCausalLM.from_pretrained(path).eval()
    query = trainer.tokenizer("hello there")["input_ids"]
    trainer.step([query, query], trainer.generate([query, query]), [1.0, -1.0])  # the adapter moves off zero
    ids = torch.tensor([query])
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(ids.shape[1])[None])
    tokens, every_position = ids[:, 1:], torch.arange(ids.shape[1])  # each next token, from each position before it
    with torch.no_grad():
        reference = trainer.passes.reference_logprobs(*inputs.values(), every_position, trainer.passes.request(tokens))
        base_logprobs = core.logprobs_from_logits(base(**inputs, use_cache=False).logits[:, :-1], tokens)
        assert torch.allclose(reference, base_logprobs, atol=1e-5)
        policy = core.logprobs_from_logits(trainer.policy(**inputs, use_cache=False).logits[:, :-1], tokens)
    assert not torch.allclose(policy, reference, atol=1e-5)  # the adapted policy differs from it


def test_filter_logits_keeps_top_k_and_the_top_p_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.9)).tolist() == [[False, False, False, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.1)).tolist() == [[False, True, True, True]]


@pytest.mark.parametrize("sampler", ["loop", "generate"])
def test_top_k_one_samples_the_greedy_answer(tokenizer, sampler):
    from trl_ext.tasks.doubling.models import build_policy

    policy = build_policy(tokenizer, seed=3)
    trainer = PPOTrainer(
        policy, _length, processing_class=tokenizer, args=doubling_ppo_config(batch_size=8, top_k=1, sampler=sampler)
    )
    queries = _prompts(tokenizer)["input_ids"]
    ids, mask = trainer.sampling.pad(queries)
    greedy = sample_responses(policy, ids, mask, SamplingOptions(8, tokenizer.eos_token_id, tokenizer.pad_token_id, 0))
    sampled = trainer.sampling.completions(ids, mask).ids
    assert torch.equal(sampled[:, : greedy.shape[1]], greedy)


def test_sampling_options_are_checked():
    with pytest.raises(ValueError, match="repetition_penalty needs sampler='generate'"):
        PPOConfig(repetition_penalty=1.2)
    with pytest.raises(ValueError, match="need 0 < top_p <= 1"):
        PPOConfig(top_p=0.0)
