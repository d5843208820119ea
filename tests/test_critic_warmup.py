"""Critic warm-up (value function alone for the first updates) and a critic started from a scalar reward model."""

import pytest
import torch

from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.trainer import PPOTrainer


def _length(completions, **_):
    return [float(len(c)) for c in completions]


def _config(**options):
    base = dict(
        batch_size=4,
        num_ppo_epochs=2,
        num_mini_batches=2,
        total_episodes=12,
        response_length=5,
        learning_rate=1e-2,
        temperature=1.0,
    )
    return PPOConfig(**{**base, **options})


def _snapshot(module):
    return [p.detach().clone() for p in module.parameters()]


def _moved(before, module):
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


@pytest.mark.parametrize("separate_critic", [False, True])
def test_warmup_trains_the_value_function_alone_then_the_policy(tokenizer, separate_critic):
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    trainer = PPOTrainer(
        build_policy(tokenizer),
        _length,
        args=_config(critic_warmup_steps=2, separate_critic=separate_critic),
        train_dataset=ppo_prompt_dataset(tokenizer, 12, seed=0),
        processing_class=tokenizer,
    )
    policy, head = _snapshot(trainer.policy), _snapshot(trainer.actor_critic.value_head)
    steps = []

    def watch(update, stats):
        steps.append((update, _moved(policy, trainer.policy), _moved(head, trainer.actor_critic.value_head)))

    trainer.train(on_update=watch)
    # updates 1 and 2: the policy (a shared backbone included) stays put, the value head learns; update 3 moves both
    assert steps == [(1, False, True), (2, False, True), (3, True, True)]


@pytest.mark.parametrize("separate_critic", [False, True])
def test_warmup_builds_no_policy_graph(tokenizer, separate_critic):
    """During warm-up the policy's part of each update pass runs without gradients: no graph of its log-probs
    or entropy is built only to be dropped, and no policy parameter gets a gradient; the update after it does."""
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    trainer = PPOTrainer(
        build_policy(tokenizer),
        _length,
        args=_config(
            critic_warmup_steps=1, total_episodes=8, separate_critic=separate_critic, ent_coef=0.01
        ),  # an entropy term: its graph is built outside warm-up
        train_dataset=ppo_prompt_dataset(tokenizer, 8, seed=0),
        processing_class=tokenizer,
    )
    head = trainer.actor_critic.value_head
    passes, backwards = {1: [], 2: []}, {1: [], 2: []}
    real_pass, real_backward = trainer.passes.policy_pass, trainer.learner.hooks.backward

    def policy_pass(*args, **kwargs):
        out = real_pass(*args, **kwargs)
        values = out.values if out.values is not None else "apart"  # a separate critic runs its own pass
        passes[trainer.update_index + 1].append(
            (out.logprobs.requires_grad, out.entropy.requires_grad, getattr(values, "requires_grad", values))
        )
        return out

    def backward(loss):
        real_backward(loss)
        backwards[trainer.update_index + 1].append(
            (any(p.grad is not None for p in trainer.policy.parameters()), head.weight.grad is not None)
        )

    trainer.passes.policy_pass, trainer.learner.hooks.backward = policy_pass, backward
    trainer.train()
    # 2 epochs x 2 minibatches a batch: the warm-up's log-probs and entropy carry no graph, its values do
    values = "apart" if separate_critic else True
    assert passes == {1: [(False, False, values)] * 4, 2: [(True, True, values)] * 4}
    # the separate critic's pass comes after the policy's backward: two backwards a step, the policy's first
    update = [(True, False), (True, True)] if separate_critic else [(True, True)]
    assert backwards == {1: [(False, True)] * 4, 2: update * 4}


def test_critic_starts_as_the_reward_model(tokenizer, tmp_path):
    from transformers import GPT2ForSequenceClassification

    from trl_ext.tasks.doubling.models import build_policy

    policy = build_policy(tokenizer)
    reward_model = GPT2ForSequenceClassification(
        policy.config.__class__(**{**policy.config.to_dict(), "num_labels": 1})
    )
    reward_model.config.pad_token_id = tokenizer.pad_token_id
    reward_model.save_pretrained(tmp_path / "rm", safe_serialization=True)
    trainer = PPOTrainer(
        policy,
        _length,
        args=_config(separate_critic=True, critic_init=str(tmp_path / "rm")),
        processing_class=tokenizer,
    )
    ids = torch.tensor([tokenizer("S数字:1234x2=2468E")["input_ids"]])
    mask = torch.ones_like(ids)
    _, values = trainer.model(ids, mask, torch.arange(ids.shape[1])[None])
    with torch.no_grad():
        score = reward_model.eval()(input_ids=ids, attention_mask=mask).logits[0, 0]
    # the critic's value of the whole sequence is the reward model's score of it
    assert values[0, -1].item() == pytest.approx(score.item(), abs=1e-5)


def test_critic_options_bad_input_names_the_option(tokenizer, tmp_path):
    from trl_ext.tasks.doubling.models import build_policy

    with pytest.raises(ValueError, match="critic_warmup_steps and critic_init need a critic"):
        _config(critic_warmup_steps=1, advantage_estimator="grpo", num_generations=2)
    with pytest.raises(ValueError, match="critic_init needs separate_critic=True"):
        _config(critic_init="somewhere")
    with pytest.raises(ValueError, match="critic_warmup_steps must not be negative"):
        _config(critic_warmup_steps=-1)
    policy = build_policy(tokenizer)
    policy.save_pretrained(tmp_path / "causal", safe_serialization=True)  # a causal LM, not a reward model
    with pytest.raises(ValueError, match="not a sequence classifier"):
        PPOTrainer(
            build_policy(tokenizer),
            _length,
            args=_config(separate_critic=True, critic_init=str(tmp_path / "causal")),
            processing_class=tokenizer,
        )
