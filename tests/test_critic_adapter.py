"""The critic as a second LoRA adapter on the policy's frozen base (critic_adapter=True): each loss trains its own
adapter, the passes run under the right adapter, save and resume, a short run, and what it costs."""

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import tiny_qwen2

from trl_ext.errors import InputError
from trl_ext.ppo import PPOConfig, PPOTrainer
from trl_ext.ppo.builder import build_models
from trl_ext.ppo.model import CRITIC_ADAPTER, CRITIC_ADAPTER_FILE, VALUE_HEAD_FILE, load_critic_adapter


def _lora(**options):
    from peft import LoraConfig

    return LoraConfig(
        task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", **options
    )


def _config(**options):
    base = dict(
        batch_size=4,
        num_ppo_epochs=2,
        num_mini_batches=1,
        total_episodes=8,
        response_length=5,
        learning_rate=1e-2,
        temperature=1.0,
        critic_adapter=True,
    )
    return PPOConfig(**{**base, **options})


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from transformers import AutoTokenizer

    path = tiny_qwen2(tmp_path_factory.mktemp("qwen") / "policy")
    return path, AutoTokenizer.from_pretrained(path)


def _base(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def _built(path, **options):
    """The actor-critic, its LoRA B matrices random (init_lora_weights=False) so that each adapter changes the
    model and every LoRA weight has a gradient."""
    torch.manual_seed(0)
    return build_models(_base(path), _config(**options), _lora(init_lora_weights=False))[0]


def _groups(model):
    """Trainable parameters by owner: the policy's adapter, the critic's, the value head; and the frozen rest."""
    named = dict(model.named_parameters())
    critic = {n: p for n, p in named.items() if f".{CRITIC_ADAPTER}." in n}
    policy = {n: p for n, p in named.items() if ".lora_" in n and n not in critic}
    head = {n: p for n, p in named.items() if n.startswith("value_head.")}
    base = {n: p for n, p in named.items() if n not in critic and n not in policy and n not in head}
    return policy, critic, head, base


def _inputs(tokenizer, rows=3):
    ids = torch.tensor([tokenizer.encode(w)[:6] for w in ("hello!", "tinyqw", "critic")][:rows])
    mask = torch.ones_like(ids)
    return ids, mask, torch.arange(ids.shape[1]).expand_as(ids)


def _has_grad(params):
    return {n: p.grad is not None and bool(p.grad.abs().sum() > 0) for n, p in params.items()}


def test_each_loss_reaches_its_own_adapter_only(qwen):
    path, tokenizer = qwen
    model = _built(path)
    policy, critic, head, base = _groups(model)
    assert policy and critic and len(policy) == len(critic)
    assert all(p.requires_grad for group in (policy, critic, head) for p in group.values())
    assert not any(p.requires_grad for p in base.values())  # the base stays frozen

    logits, values = model(*_inputs(tokenizer))
    values.square().mean().backward()  # a value loss
    assert all(_has_grad(critic).values()) and all(_has_grad(head).values())
    assert not any(_has_grad(policy).values()) and all(p.grad is None for p in base.values())

    model.zero_grad(set_to_none=True)
    logits, values = model(*_inputs(tokenizer))
    torch.log_softmax(logits, -1)[..., 0].mean().backward()  # a policy loss
    assert all(_has_grad(policy).values())
    assert not any(_has_grad(critic).values()) and not any(_has_grad(head).values())
    assert all(p.grad is None for p in base.values())
    # still both trainable after the adapter switches of the passes
    assert all(p.requires_grad for group in (policy, critic) for p in group.values())
    assert model.policy.active_adapter == "default"


def _one_adapter(path, model, adapter):
    """A fresh PEFT model of the base with one adapter, holding ``adapter``'s weights of ``model``: what a forward
    under that adapter alone gives."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    single = get_peft_model(_base(path), _lora())
    set_peft_model_state_dict(single, get_peft_model_state_dict(model.policy, adapter_name=adapter))
    return single.eval()


def test_values_logprobs_and_reference_come_from_their_own_adapter(qwen):
    from accelerate import Accelerator

    from trl_ext.ppo import core
    from trl_ext.ppo.forward import ForwardPasses

    path, tokenizer = qwen
    model = _built(path)
    cfg = _config()
    passes = ForwardPasses(model, model.policy, None, Accelerator(cpu=True), cfg, len(tokenizer))
    inputs = _inputs(tokenizer)
    responses = inputs[0][:, 3:]
    old_logprobs, values = passes.old_policy(inputs, responses)
    reference = passes.reference(inputs, responses)

    def logprobs_of(lm):
        with torch.no_grad():
            logits = lm(*inputs[:1], attention_mask=inputs[1], position_ids=inputs[2]).logits[:, 2:-1]
        return core.logprobs_from_logits(logits, responses, cfg.temperature)

    torch.testing.assert_close(old_logprobs, logprobs_of(_one_adapter(path, model, "default")))
    torch.testing.assert_close(reference, logprobs_of(_base(path)))  # adapters off: the base model
    assert (old_logprobs - reference).abs().max() > 1e-3  # the policy's adapter does change the model
    with torch.no_grad():
        critic = _one_adapter(path, model, CRITIC_ADAPTER).get_base_model().model
        hidden = critic(input_ids=inputs[0], attention_mask=inputs[1], position_ids=inputs[2]).last_hidden_state
        expected = model.value_head(hidden).squeeze(-1)[:, 2:-1]
    torch.testing.assert_close(values, expected)


def test_activation_checkpointing_recomputes_each_pass_under_its_own_adapter(qwen):
    path, tokenizer = qwen
    grads = []
    for checkpointing in (False, True):
        model = _built(path, gradient_checkpointing=checkpointing)
        model.train()
        logits, values = model(*_inputs(tokenizer))
        (torch.log_softmax(logits, -1)[..., 0].mean() + values.square().mean()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


def test_a_pass_asks_for_outputs_the_critic_has(qwen):
    path, tokenizer = qwen
    with pytest.raises(InputError, match="got 'value'"):
        _built(path)(*_inputs(tokenizer), outputs="value")
    shared = build_models(_base(path), _config(critic_adapter=False), _lora())[0]  # the value head on the policy's
    with pytest.raises(InputError, match="a backbone of its own"):
        shared(*_inputs(tokenizer), outputs="values")
    logits, values = _built(path)(*_inputs(tokenizer), outputs="values")
    assert logits is None and values.shape == _inputs(tokenizer)[0].shape


def test_critic_adapter_needs_lora_and_a_critic(qwen):
    path, _ = qwen
    with pytest.raises(InputError, match="critic_adapter needs a LoRA policy"):
        build_models(_base(path), _config(), peft_config=None)
    with pytest.raises(InputError, match="critic_adapter"):
        _config(separate_critic=True)
    with pytest.raises(InputError, match="critic_adapter"):
        _config(advantage_estimator="grpo", num_generations=2)


def _count(params):
    return sum(p.numel() for p in params)


def test_critic_adapter_costs_an_adapter_not_a_backbone(qwen):
    path, _ = qwen
    model = _built(path)
    policy, critic, head, base = _groups(model)
    trainable = _count(p for p in model.parameters() if p.requires_grad)
    assert _count(critic.values()) == _count(policy.values())
    assert trainable == _count(policy.values()) + _count(critic.values()) + _count(head.values())
    assert _count(model.parameters()) == _count(base.values()) + trainable  # no second backbone
    from peft.tuners.lora import LoraLayer

    # LoRA-sized: r x (in + out) for each adapted linear layer, at r = 4 an eighth of a 32-wide layer here (1/144
    # of SmolLM2-135M's 576-wide ones)
    adapted = [m.base_layer for m in model.policy.modules() if isinstance(m, LoraLayer)]
    assert _count(critic.values()) == sum(4 * (m.in_features + m.out_features) for m in adapted)
    copied = build_models(_base(path), _config(critic_adapter=False, separate_critic=True), _lora())[0]
    assert _count(critic.values()) < _count(copied.critic_backbone.parameters()) / 5


def _prompts(tokenizer, n=8):
    from datasets import Dataset

    words = ["ab", "cde", "fg", "hij", "kl", "mno", "pq", "rst"]
    return Dataset.from_dict({"input_ids": [tokenizer.encode(words[i % len(words)]) for i in range(n)]})


def _length(completions, **_):
    return [float(len(c)) / 5 for c in completions]


def _trainer(path, tokenizer, **options):
    from transformers import AutoModelForCausalLM

    return PPOTrainer(
        AutoModelForCausalLM.from_pretrained(path),
        _length,
        args=_config(**options),
        train_dataset=_prompts(tokenizer),
        processing_class=tokenizer,
        peft_config=_lora(),
    )


def test_short_run_trains_both_adapters_and_resumes_them(qwen, tmp_path):
    path, tokenizer = qwen
    trainer = _trainer(path, tokenizer, output_dir=str(tmp_path / "run"), save_steps=1)
    policy, critic, head, base = _groups(trainer.actor_critic)
    before = {n: p.detach().clone() for group in (policy, critic, head, base) for n, p in group.items()}
    history = trainer.train()
    assert len(history) == 2 and all(torch.isfinite(torch.tensor(float(h["loss/value_avg"]))) for h in history)
    moved = {n: not torch.equal(before[n], p) for group in (policy, critic, head, base) for n, p in group.items()}
    assert any(moved[n] for n in policy) and any(moved[n] for n in critic) and any(moved[n] for n in head)
    assert not any(moved[n] for n in base)

    resumed = _trainer(path, tokenizer, output_dir=str(tmp_path / "run"), resume_from_checkpoint="latest")
    assert resumed.update_index == 2
    trained = dict(trainer.actor_critic.named_parameters())
    for name, param in resumed.actor_critic.named_parameters():
        if param.requires_grad:
            assert torch.equal(param, trained[name]), name


def test_save_writes_the_policy_adapter_and_the_critic_beside(qwen, tmp_path):
    from peft import PeftModel

    path, tokenizer = qwen
    trainer = _trainer(path, tokenizer)
    trainer.train()
    out = trainer.save(tmp_path / "saved")
    assert (out / "adapter_model.safetensors").exists() and not (out / CRITIC_ADAPTER).exists()
    assert not any(
        f".{CRITIC_ADAPTER}." in k or "critic" in k for k in load_file(str(out / "adapter_model.safetensors"))
    )
    assert (out / VALUE_HEAD_FILE).exists() and (out / CRITIC_ADAPTER_FILE).exists()

    saved_policy = PeftModel.from_pretrained(_base(path), out).eval()
    ids = torch.tensor([tokenizer.encode("hello")])
    with torch.no_grad():
        torch.testing.assert_close(saved_policy(ids).logits, trainer.policy(ids).logits)

    fresh = _built(path)
    assert load_critic_adapter(fresh.policy, out)
    trained = dict(trainer.actor_critic.policy.named_parameters())
    for name, param in fresh.policy.named_parameters():
        if f".{CRITIC_ADAPTER}." in name:
            assert torch.equal(param, trained[name]), name


def _record_passes_and_backwards(trainer) -> list[str]:
    """The order of the critic's own passes and the backward passes from now on."""
    events: list[str] = []
    value_pass, backward = trainer.passes.value_pass, trainer.learner.hooks.backward

    def recorded_value_pass(*args, **kwargs):
        events.append("critic pass")
        return value_pass(*args, **kwargs)

    def recorded_backward(loss):
        events.append("backward")
        backward(loss)

    trainer.passes.value_pass, trainer.learner.hooks.backward = recorded_value_pass, recorded_backward
    return events


@pytest.mark.parametrize("critic", ["critic_adapter", "separate_critic"])
def test_the_critic_apart_holds_one_graph_at_a_time_and_changes_no_number(qwen, critic):
    """A critic with a backbone of its own runs its pass after the policy's backward (peak memory of one pass, not
    two): every update's stats and every trained weight as with one backward over both losses."""
    path, tokenizer = qwen
    options = {"critic_adapter": critic == "critic_adapter", "separate_critic": critic == "separate_critic"}
    runs = {}
    for apart in (True, False):
        torch.manual_seed(0)
        trainer = _trainer(path, tokenizer, **options)
        assert trainer.passes.critic_apart  # one process, a backbone of the critic's own
        trainer.passes.critic_apart = apart
        events = _record_passes_and_backwards(trainer)
        history = trainer.train()
        weights = {n: p.detach().clone() for n, p in trainer.actor_critic.named_parameters() if p.requires_grad}
        runs[apart] = history, weights, events
    (apart_history, apart_weights, apart_events), (joint_history, joint_weights, joint_events) = runs[True], runs[False]
    # each of 2 updates: the old values (no graph), then 2 epochs of one step: the policy's backward before the
    # critic's pass, the critic's backward after it
    step = ["backward", "critic pass", "backward"]
    assert apart_events == (["critic pass"] + step * 2) * 2 and joint_events == ["backward"] * 4
    for apart_stats, joint_stats in zip(apart_history, joint_history, strict=True):
        for name, value in joint_stats.items():
            if name.startswith(("loss/", "val/", "policy/", "objective/")):
                assert float(apart_stats[name]) == pytest.approx(float(value), rel=1e-5, abs=1e-6), name
    for name, weight in joint_weights.items():
        torch.testing.assert_close(apart_weights[name], weight, rtol=1e-5, atol=1e-6, msg=name)
