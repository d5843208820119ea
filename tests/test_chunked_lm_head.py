"""chunked_lm_head changes memory only: log-probs from the hidden states, the LM head applied in chunks, equal the
whole logits' (values and gradients), a whole update equals the one without it, and where it would compute something
else it is refused in one line."""

import copy

import pytest
import torch
from test_micro_batches import TOLERANCE, _update
from weight_gaps import assert_same_adam_steps

from trl_ext.errors import InputError
from trl_ext.ppo import core
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.lm_head import check_plain_head, logprobs_from_hidden


@pytest.mark.parametrize("chunk_elements", [50 * 2, 50 * 7, 10**6], ids=["2-rows", "7-rows", "one-chunk"])
def test_log_probs_from_hidden_states_equal_the_whole_logits(chunk_elements):
    torch.manual_seed(0)
    hidden = torch.randn(3, 6, 8, requires_grad=True)
    weight, bias = torch.randn(50, 8, requires_grad=True), torch.randn(50, requires_grad=True)
    tokens = torch.randint(0, 50, (3, 6))
    logits = torch.nn.functional.linear(hidden, weight, bias)
    expected = core.logprobs_from_logits(logits, tokens, 0.7)
    expected_entropy = core.entropy_from_logits(logits, 0.7)
    logprobs, entropy = logprobs_from_hidden(
        hidden, weight, bias, tokens, 0.7, entropy=True, entropy_grad=True, chunk_elements=chunk_elements
    )
    assert torch.allclose(logprobs, expected, atol=1e-6) and torch.allclose(entropy, expected_entropy, atol=1e-6)
    leaves = (hidden, weight, bias)
    for ours, theirs in zip(
        torch.autograd.grad((1.3 * logprobs + entropy).sum(), leaves),
        torch.autograd.grad((1.3 * expected + expected_entropy).sum(), leaves),
    ):
        assert torch.allclose(ours, theirs, atol=1e-5)
    _, no_grad_entropy = logprobs_from_hidden(hidden, weight, bias, tokens, entropy=True)
    assert not no_grad_entropy.requires_grad  # without entropy_grad the entropy is a statistic


def _stored_bytes(function) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of ``function()`` (a tensor saved by
    several chunks, the head's weight, counted once)."""
    saved = {}

    def keep(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        function()
    return sum(saved.values())


def test_the_graph_keeps_the_hidden_states_not_the_logits():
    hidden = torch.randn(4, 16, 8, requires_grad=True)
    weight = torch.randn(1000, 8, requires_grad=True)
    tokens = torch.randint(0, 1000, (4, 16))
    whole = _stored_bytes(lambda: core.logprobs_from_logits(torch.nn.functional.linear(hidden, weight), tokens))
    chunked = _stored_bytes(lambda: logprobs_from_hidden(hidden, weight, None, tokens, chunk_elements=8000)[0])
    assert whole >= 4 * 16 * 1000 * 4  # the logits, float32 here
    assert chunked <= (hidden.numel() + weight.numel()) * 4 + tokens.numel() * 8  # the inputs and the ids alone


@pytest.mark.parametrize(
    "options",
    [
        {},  # PPO: GAE, a shared critic, a separate reference (the KL term)
        {"advantage_estimator": "grpo", "num_generations": 2, "loss_type": "grpo", "beta": 0.1, "ent_coef": 0.01},
        {"local_rollout_forward_batch_size": 3, "micro_batch_size": 3},
        {"num_mini_batches": 1},  # the experience phase's pass, with its graph, is the first step's
    ],
    ids=["ppo", "grpo-beta-entropy", "micro-batches", "one-forward"],
)
def test_an_update_with_the_chunked_head_equals_one_without(tokenizer, options):
    from trl_ext.tasks.doubling.models import build_policy

    policy = build_policy(tokenizer, seed=1)  # GPT-2, its head tied to the input embedding
    whole_stats, whole_weights = _update(tokenizer, copy.deepcopy(policy), options)
    model_forwards = []  # calls of the causal LM's own forward (its head on every position kept)
    chunked_stats, chunked_weights = _update(
        tokenizer, copy.deepcopy(policy), {**options, "chunked_lm_head": True}, model_forwards
    )
    assert not model_forwards  # every pass went through the backbone and the chunked head
    for name, value in whole_stats.items():
        if isinstance(value, float):
            assert chunked_stats[name] == pytest.approx(value, rel=1e-6, abs=TOLERANCE), name
    assert_same_adam_steps(whole_weights, chunked_weights)


def test_a_lora_policy_its_reference_and_critic_adapter_with_the_chunked_head(tokenizer):
    """A LoRA policy: the reference is the base with its adapters off, the critic a second adapter."""
    from peft import LoraConfig

    from trl_ext.tasks.doubling.models import build_policy

    policy = build_policy(tokenizer, seed=1)
    lora = LoraConfig(r=4, target_modules=["c_attn", "c_fc"], init_lora_weights=False, task_type="CAUSAL_LM")
    options = {"critic_adapter": True, "kl_coef": 0.2}
    runs = [
        _update(tokenizer, copy.deepcopy(policy), {**options, **extra}, peft_config=lora)
        for extra in ({}, {"chunked_lm_head": True})
    ]
    (whole_stats, whole_weights), (chunked_stats, chunked_weights) = runs
    assert whole_stats["objective/kl"] != 0.0  # adapters on from the start: the policy is not its reference
    for name, value in whole_stats.items():
        if isinstance(value, float):
            assert chunked_stats[name] == pytest.approx(value, rel=1e-6, abs=TOLERANCE), name
    assert_same_adam_steps(whole_weights, chunked_weights)


def _tiny(kind: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **sizes))


def test_a_model_whose_logits_are_more_than_its_head_is_refused_in_one_line():
    from peft import LoraConfig, get_peft_model

    check_plain_head(_tiny("qwen2"))
    with pytest.raises(InputError, match=r"chunked_lm_head .* 'gemma2' model \(Gemma2ForCausalLM\)"):
        check_plain_head(_tiny("gemma2"))  # its logits are soft-capped after the head
    adapted = get_peft_model(_tiny("qwen2"), LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(InputError, match="plain nn.Linear; it is a Linear"):
        check_plain_head(adapted)


@pytest.mark.needs_trl_ppo
def test_trls_ppo_refuses_the_chunked_head():
    from trl_ext.trl_compat.backend import build_trl_trainer

    with pytest.raises(InputError, match="chunked_lm_head needs the scratch backend"):
        build_trl_trainer(PPOConfig(chunked_lm_head=True), None, None, None, None, None)


def test_a_reference_of_its_own_and_the_launch_are_checked_too():
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from trl_ext.ppo.forward import check_chunked_head

    one_process = SimpleNamespace(distributed_type=DistributedType.NO)
    check_chunked_head([_tiny("qwen2"), _tiny("llama")], one_process)
    with pytest.raises(InputError, match="'gemma2' model"):
        check_chunked_head([_tiny("qwen2"), _tiny("gemma2")], one_process)  # a reference given by the user
    with pytest.raises(InputError, match="one process or under DDP; this launch is FSDP"):
        check_chunked_head([_tiny("qwen2")], SimpleNamespace(distributed_type=DistributedType.FSDP))


def test_with_the_chunked_head_a_pass_takes_the_whole_batch(tokenizer, monkeypatch):
    """The automatic pass size bounds a pass's logits; the chunked head makes none."""
    from trl_ext.ppo import forward
    from trl_ext.ppo.trainer import PPOTrainer
    from trl_ext.tasks.doubling.models import build_policy

    monkeypatch.setattr(forward, "LOGITS_BUDGET", 10)  # one row's logits are over it
    responses = torch.zeros(8, 5, dtype=torch.long)
    for chunked, rows in ((False, 1), (True, 8)):
        cfg = PPOConfig(batch_size=8, response_length=5, chunked_lm_head=chunked)
        trainer = PPOTrainer(build_policy(tokenizer), args=cfg, processing_class=tokenizer)
        assert trainer.passes.rows(0, 8, responses) == rows
        assert trainer.passes.rows(3, 8, responses) == 3  # a size set is kept
    with pytest.raises(InputError, match="indices"):
        trainer.actor_critic(responses, torch.ones_like(responses), None, logits_to_keep=2, logprobs_of=object())
