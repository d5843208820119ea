"""Where the first optimizer step's forward covers the whole batch (one minibatch, one micro-batch), the experience
phase runs it (no separate no-grad pass for the old log-probs and values, as TRL's GRPO with num_iterations=1),
at any number of epochs, with or without a critic; the update equals the one with that pass forced back on.
Several minibatches or micro-batches keep the pass; the reference runs only for a KL term."""

import copy

import pytest
import torch

from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.learner import Learner
from trl_ext.ppo.trainer import PPOTrainer

TOLERANCE = 1e-6
# The critic's correlation divides by the values' spread over 4 rows: a float32 rounding of 1e-7 in a value moves it
# by ~1e-6, so it is held to 1e-5 (the values themselves are held to TOLERANCE through the losses).
RATIO_TOLERANCE = {"val/first_value_return_corr": 1e-5}
RESPONSES = ["12E", "二四E", "E", "陆陆肆零E", "246E", "4", "8E", "1234567"]
ONE_STEP = dict(num_ppo_epochs=1, num_mini_batches=1, max_grad_norm=1.0)
CRITIC_FREE = {
    "grpo-beta-entropy": dict(
        advantage_estimator="grpo", num_generations=4, kl_coef=0.0, beta=0.1, loss_type="grpo", ent_coef=0.01
    ),
    "grpo-no-kl": dict(advantage_estimator="grpo", num_generations=4, kl_coef=0.0, beta=0.0, loss_type="bnpo"),
    "rloo-kl-in-reward": dict(
        advantage_estimator="rloo",
        num_generations=4,
        kl_coef=0.2,
        kl_estimator="k1",
        kl_mode="sequence",
        policy_loss="sequence_clip",
        loss_type="grpo",
    ),
    "reinforce_pp": dict(advantage_estimator="reinforce_pp", num_generations=1, kl_coef=0.2),
}
WITH_CRITIC = {  # PPO: GAE and a value head (shared or separate), several epochs
    "ppo-4-epochs": dict(num_ppo_epochs=4, max_grad_norm=1.0),
    "ppo-separate-critic-2-epochs": dict(num_ppo_epochs=2, separate_critic=True, vf_coef=0.5),
}
CASES = {**{k: {**ONE_STEP, **v} for k, v in CRITIC_FREE.items()}, **WITH_CRITIC}


def _run(tokenizer, policy, options, updates=1):
    """``updates`` calls of ``step`` on fixed rollouts: the stats of each, the gradients of each optimizer step,
    the weights after, the forward passes of policy and reference counted."""
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    # lr 1e-5: Adam's first steps are ~lr wherever a gradient is ~0, so rounding there moves a weight by up to lr
    cfg = PPOConfig(batch_size=len(RESPONSES), learning_rate=1e-5, response_length=7, **options)
    trainer = PPOTrainer(policy, args=cfg, processing_class=tokenizer)
    gradients = []
    optimizer_step = trainer._optimizer_step

    def recording_step():
        gradients.append({n: p.grad.clone() for n, p in trainer.policy.named_parameters() if p.grad is not None})
        optimizer_step()

    trainer._optimizer_step = recording_step
    passes = {"policy": 0, "reference": 0}
    trainer.policy.register_forward_hook(lambda *_: passes.__setitem__("policy", passes["policy"] + 1))
    kl_term = options.get("kl_coef", PPOConfig.kl_coef) > 0 or options.get("beta", 0) > 0
    assert (trainer.ref_policy is not None) == kl_term  # no copy of the policy where no KL term reads it
    if kl_term:
        trainer.ref_policy.register_forward_hook(lambda *_: passes.__setitem__("reference", passes["reference"] + 1))
    queries = ppo_prompt_dataset(tokenizer, len(RESPONSES), seed=0)["input_ids"]
    responses = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in RESPONSES]
    history = [
        trainer.step(queries, responses, [0.5 * i - 1.5 + u for i in range(len(RESPONSES))]) for u in range(updates)
    ]
    weights = {}
    for name, p in trainer.policy.named_parameters():
        if name.endswith("attn.c_attn.bias"):  # the key bias: a zero gradient up to rounding (test_micro_batches)
            width = p.shape[0] // 3
            p = torch.cat([p[:width], p[2 * width :]])
        weights[name] = p.detach().clone()
    return history, gradients, weights, passes


@pytest.mark.parametrize("case", list(CASES))
def test_one_forward_update_equals_the_update_after_an_old_logprob_pass(tokenizer, monkeypatch, case):
    from trl_ext.tasks.doubling.models import build_policy

    options = CASES[case]
    epochs = options["num_ppo_epochs"]
    policy = build_policy(tokenizer, seed=1)
    fused, fused_gradients, fused_weights, fused_passes = _run(tokenizer, copy.deepcopy(policy), options, updates=2)
    with monkeypatch.context() as patch:  # the old-logprob pass forced back on
        patch.setattr(Learner, "one_forward", lambda self, responses, warming_up: False)
        full, full_gradients, full_weights, full_passes = _run(tokenizer, copy.deepcopy(policy), options, updates=2)
    # one forward an update's first step, not two
    assert fused_passes["policy"] == 2 * epochs and full_passes["policy"] == 2 * (epochs + 1)
    kl_term = options.get("kl_coef", PPOConfig.kl_coef) > 0 or options.get("beta", 0) > 0
    assert fused_passes["reference"] == full_passes["reference"] == (2 if kl_term else 0)
    for ours, theirs in zip(fused, full):
        assert ours.keys() == theirs.keys() and ("objective/kl" in ours) == kl_term
        for name, value in theirs.items():
            if isinstance(value, float) and not name.startswith("timing/"):
                tolerance = RATIO_TOLERANCE.get(name, TOLERANCE)
                assert ours[name] == pytest.approx(value, rel=tolerance, abs=tolerance), name
    if epochs == 1:
        assert fused[0]["val/ratio"] == 1.0  # old = new log-probs: the ratio is exactly 1
    # The full path's forward runs on the shuffled minibatch, ours on the batch in order: the gradients' float32
    # sums differ in their last bits (up to 7e-7 measured, on gradients of up to 1.1)
    assert len(fused_gradients) == len(full_gradients) == 2 * epochs
    for ours, theirs in zip(fused_gradients, full_gradients):
        assert ours.keys() == theirs.keys()
        assert max((ours[n] - theirs[n]).abs().max().item() for n in theirs) < 1e-5
    start = {n: p.detach() for n, p in policy.named_parameters()}
    assert (
        fused_weights["transformer.h.0.mlp.c_fc.weight"] - start["transformer.h.0.mlp.c_fc.weight"]
    ).abs().max() > 5e-6
    gap = max((fused_weights[n] - full_weights[n]).abs().max().item() for n in full_weights)
    assert gap < TOLERANCE


@pytest.mark.parametrize(
    "options, update_passes",
    [
        ({}, 4),  # PPO: GAE with a critic, 4 epochs (PPOConfig's defaults): the experience pass is the first epoch's
        ({**ONE_STEP}, 1),  # PPO with one step per batch
        ({**CRITIC_FREE["grpo-beta-entropy"], "num_ppo_epochs": 2}, 2),
        ({**CRITIC_FREE["rloo-kl-in-reward"], "num_ppo_epochs": 1, "num_mini_batches": 2}, 1 + 2),
        ({**CRITIC_FREE["grpo-no-kl"], **ONE_STEP, "micro_batch_size": 3}, 1 + 3),  # micro-batches of 3 + 3 + 2
        ({"critic_warmup_steps": 1}, 1 + 4),  # the critic's warm-up steps run the critic alone: no fused pass
    ],
    ids=["ppo", "ppo-one-step", "grpo-2-epochs", "rloo-2-minibatches", "grpo-micro-batches", "critic-warm-up"],
)
def test_policy_passes_an_update(tokenizer, options, update_passes):
    from trl_ext.tasks.doubling.models import build_policy

    *_, passes = _run(tokenizer, build_policy(tokenizer, seed=1), options)
    assert passes["policy"] == update_passes
