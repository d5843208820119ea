"""The 'static-copy' sampler decodes with a copy of the policy in the forward's dtype, LoRA merged, synced only
after the policy moved (CPU, eager)."""

import copy

import pytest
import torch
from test_static_sampler import _queries, _qwen2, trained_history

from trl_ext.ppo.rollout.decode_copy import DecodeCopy, forward_dtype
from trl_ext.ppo.rollout.interface import SamplingOptions
from trl_ext.ppo.rollout.policy_weights import policy_weights
from trl_ext.ppo.rollout.samplers import build_sampler
from trl_ext.ppo.rollout.static_sampler import StaticDecoder

OPTIONS = SamplingOptions(max_new_tokens=12, eos_token_id=-1, pad_token_id=0, temperature=1.0, top_k=20)


def _lora_qwen2():
    from peft import LoraConfig, get_peft_model

    model = _qwen2()
    torch.manual_seed(1)  # init_lora_weights=False: B is random too, so the adapters change the output
    return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)).eval()


def _draw(sampler_or_decoder, model):
    ids, mask = _queries()
    generator = torch.Generator().manual_seed(7)
    if isinstance(sampler_or_decoder, StaticDecoder):
        return sampler_or_decoder(model, ids, mask, OPTIONS, generator)
    return sampler_or_decoder.sample(model, ids, mask, OPTIONS, generator).ids


def test_the_copy_is_the_policy_merged_in_the_dtype_asked_for():
    policy = _lora_qwen2()
    decode = DecodeCopy().of(policy, torch.bfloat16)
    assert not any("lora" in name for name, _ in decode.named_parameters())
    assert {p.dtype for p in decode.parameters()} == {torch.bfloat16}
    weights = dict(policy_weights(policy, torch.bfloat16))
    assert set(decode.state_dict()) == set(weights)
    for name, value in decode.state_dict().items():
        assert torch.equal(value, weights[name]), name


def test_static_copy_draws_what_the_static_sampler_draws_from_the_merged_policy():
    policy = _lora_qwen2()
    merged = copy.deepcopy(policy).merge_and_unload().eval()
    from_copy = _draw(build_sampler("static-copy"), policy)
    assert torch.equal(from_copy, _draw(StaticDecoder(), merged))
    with policy.disable_adapter():
        assert not torch.equal(from_copy, _draw(StaticDecoder(), policy))  # the adapters were merged in


def test_the_copy_follows_the_policy_when_told_it_moved_in_place():
    policy, sampler = _qwen2(), build_sampler("static-copy")
    before = _draw(sampler, policy)
    decode = sampler.copy.of(policy, torch.float32)
    pointers = [p.data_ptr() for p in decode.parameters()]
    with torch.no_grad():
        policy.lm_head.weight.mul_(-1.0)  # a step the sampler has not been told of
    assert torch.equal(_draw(sampler, policy), before)
    sampler.policy_changed()
    after = _draw(sampler, policy)
    assert not torch.equal(after, before)
    assert torch.equal(after, _draw(StaticDecoder(), policy))
    assert [p.data_ptr() for p in sampler.copy.of(policy, torch.float32).parameters()] == pointers  # same tensors


def test_the_forward_dtype_is_autocasts_where_it_is_on():
    policy = _qwen2()
    assert forward_dtype(policy, torch.device("cpu")) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert forward_dtype(policy, torch.device("cpu")) == torch.bfloat16
        decode = build_sampler("static-copy")
        _draw(decode, policy)
    assert {p.dtype for p in decode.copy.of(policy, torch.bfloat16).parameters()} == {torch.bfloat16}


def test_the_trainer_trains_the_same_with_the_copy_as_with_the_policy(tokenizer):
    """float32 throughout, so the copy's weights are the policy's to the bit: the same rollouts, the same updates
    (GPT-2: tied embeddings), three of them, the copy synced after each."""
    with_copy = trained_history(tokenizer, "static-copy", total_episodes=12)
    assert len(with_copy) == 3
    assert with_copy == trained_history(tokenizer, "static", total_episodes=12)


def test_tied_weights_that_an_adapter_makes_differ_are_refused():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trl_ext.errors import InputError

    torch.manual_seed(0)
    sizes = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2
    )
    tied = Qwen2ForCausalLM(Qwen2Config(vocab_size=96, tie_word_embeddings=True, **sizes)).eval()
    _draw(build_sampler("static-copy"), tied)  # tied and equal: one weight, written twice
    adapted = get_peft_model(tied, LoraConfig(r=2, target_modules=["embed_tokens"], init_lora_weights=False)).eval()
    with pytest.raises(InputError, match="ties model.embed_tokens.weight and lm_head.weight but they differ"):
        _draw(build_sampler("static-copy"), adapted)
