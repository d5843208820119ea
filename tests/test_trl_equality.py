"""One whole PPO update of ours equals one of TRL 1.12's PPOTrainer, given the same rollouts.

Both trainers start from the same weights and see the same queries, responses (some ending in eos
at different lengths, one cut off without eos) and scores. TRL generates inside ``train()``, so its
``batch_generation`` is replaced by one that returns these responses with the logits TRL's own
forward pass gives them; its reward model is a reward function reading the score column. TRL's
minibatch shuffles (``np.random.permutation``) are recorded and replayed on our side. Then every
minibatch's policy loss, value loss and total loss, the update's stats and all weights afterwards
must agree.
"""

import copy

import numpy as np
import pytest
import torch
from weight_gaps import assert_same_adam_steps

from trl_ext.ppo import core, losses
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config

pytestmark = pytest.mark.needs_trl_ppo

TOLERANCE = 1e-5
# Responses of 1 to 6 tokens ending in eos (E), one cut off at the response length without it.
RESPONSES = [
    "12E",
    "二四E",
    "E",
    "陆陆肆零E",
    "246E",
    "4",
    "8E",
    "1234567",
    "六E",
    "柒E",
    "90E",
    "零零E",
    "3E",
    "伍E",
    "二二E",
    "5678E",
]


def _rollouts(tokenizer, n):
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    data = ppo_prompt_dataset(tokenizer, n, seed=3)
    responses = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in RESPONSES[:n]]
    scores = [
        float(s) for s in torch.linspace(-2.0, 3.0, n)[torch.randperm(n, generator=torch.Generator().manual_seed(0))]
    ]
    return data.add_column("fixed_score", scores), responses, scores


def _fixed_score(prompts, completions, fixed_score, **_):
    return fixed_score


def _trl_update(cfg, policy, tokenizer, data, responses, tmp_path, monkeypatch):
    """One TRL 1.12 update on the given rollouts; returns the trainer and what it computed per minibatch."""
    from trl.experimental.ppo import ppo_trainer as trl_ppo

    from trl_ext.trl_compat.backend import build_trl_trainer

    by_query = {tuple(ids): resp for ids, resp in zip(data["input_ids"], responses)}
    pad = tokenizer.pad_token_id

    def replayed_generation(model, queries, _batch, pad_token_id, _generation_config):
        rows = [by_query[tuple(t for t in q.tolist() if t != pad_token_id)] for q in queries]
        width = max(len(r) for r in rows)
        padded = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=queries.device)
        query_responses = torch.cat([queries, padded], dim=1)
        with torch.no_grad():  # the logits TRL's sampler returns: temperature-scaled, at the response positions
            logits = trl_ppo.forward(model, query_responses, pad_token_id).logits
        logits = logits[:, queries.shape[1] - 1 : -1] / (cfg.temperature + 1e-7)
        return query_responses, logits

    recorded = {"losses": [], "orders": [], "masked_means": [], "logs": []}
    real_masked_mean, real_permutation = trl_ppo.masked_mean, np.random.permutation

    def recording_masked_mean(values, mask, *args, **kwargs):
        result = real_masked_mean(values, mask, *args, **kwargs)
        if result.requires_grad:  # in TRL's minibatch loop: the value loss, then the policy loss
            recorded["masked_means"].append(result.item())
        return result

    def recording_permutation(n):
        order = real_permutation(n)
        recorded["orders"].append(order.copy())
        return order

    monkeypatch.setattr(trl_ppo, "batch_generation", replayed_generation)
    monkeypatch.setattr(trl_ppo, "masked_mean", recording_masked_mean)
    monkeypatch.setattr(np.random, "permutation", recording_permutation)
    trainer = build_trl_trainer(cfg, policy, tokenizer, _fixed_score, data, tmp_path / "trl")
    real_backward = trainer.accelerator.backward
    monkeypatch.setattr(
        trainer.accelerator,
        "backward",
        lambda loss, **kw: (recorded["losses"].append(loss.item()), real_backward(loss, **kw)),
    )
    real_log = trainer.log
    monkeypatch.setattr(trainer, "log", lambda logs, *a: (recorded["logs"].append(dict(logs)), real_log(logs, *a)))
    head = trainer.accelerator.unwrap_model(trainer.model).value_model.with_value_head.v_head.summary
    recorded["head_before"] = {"weight": head.weight.detach().clone(), "bias": head.bias.detach().clone()}
    np.random.seed(0)
    trainer.train()
    means = recorded["masked_means"]
    recorded["value_losses"] = [0.5 * v for v in means[0::2]]
    recorded["policy_losses"] = means[1::2]
    return trainer, recorded


class _ReplayingTrainer:
    """Our trainer with TRL's recorded minibatch orders and every minibatch's losses kept."""

    @staticmethod
    def build(cfg, policy, tokenizer, orders, monkeypatch):
        from trl_ext.ppo.trainer import PPOTrainer

        recorded = {"losses": [], "policy_losses": [], "value_losses": []}

        class Replaying(PPOTrainer):
            def _minibatch_order(self, size):
                return torch.as_tensor(orders.pop(0))

            def _backward(self, loss):  # one micro-batch per minibatch here: its last backward's loss is the
                self.last_loss = loss.item()  # minibatch's (a critic apart backs the policy's term first)
                super()._backward(loss)

            def _optimizer_step(self):
                recorded["losses"].append(self.last_loss)
                super()._optimizer_step()

        for module, name, key in (
            (losses, "policy_loss", "policy_losses"),
            (core, "clipped_value_loss", "value_losses"),
        ):
            real = getattr(module, name)

            def recording(*args, _real=real, _key=key, **kwargs):
                loss, stats = _real(*args, **kwargs)
                recorded[_key].append(loss.item())
                return loss, stats

            monkeypatch.setattr(module, name, recording)
        return Replaying(policy, args=cfg, processing_class=tokenizer), recorded


def _weights(module):
    """Every parameter, less the key part of GPT-2's attention bias: adding a constant to every
    attention score of a row changes nothing, so its gradient is zero up to rounding, and Adam turns
    that rounding noise into steps of up to +-lr in either trainer (at lr 1e-3 that slice alone
    differed, by up to 5e-5). The updated models' logits are compared as well."""
    weights = {}
    for name, p in module.named_parameters():
        p = p.detach().clone()
        if name.endswith("attn.c_attn.bias"):
            width = p.shape[0] // 3
            p = torch.cat([p[:width], p[2 * width :]])  # query and value parts
        weights[name] = p
    return weights


def _max_difference(ours: dict, theirs: dict) -> float:
    assert ours.keys() == theirs.keys()
    return max((ours[k] - theirs[k]).abs().max().item() for k in ours)


def _logits(policy, tokenizer, data, responses):
    from trl_ext.data.batching import pad_batch

    ids, mask = pad_batch([q + r for q, r in zip(data["input_ids"], responses)], tokenizer.pad_token_id, side="right")
    with torch.no_grad():
        return policy(input_ids=ids, attention_mask=mask).logits * mask[..., None]


def _run_both(
    tokenizer,
    tmp_path,
    monkeypatch,
    separate_critic=False,
    score_position="after_last_token",
    whiten_rewards=False,
    num_mini_batches=4,
):
    from trl_ext.tasks.doubling.models import build_policy

    n = len(RESPONSES)
    cfg = doubling_ppo_config(
        batch_size=n,
        num_mini_batches=num_mini_batches,
        num_ppo_epochs=2,
        total_episodes=n,
        learning_rate=1e-4,
        separate_critic=separate_critic,
        score_position=score_position,
        whiten_rewards=whiten_rewards,
        kl_coef=0.1,
        response_length=7,
        cliprange=0.1,
        cliprange_value=0.05,
    )
    data, responses, scores = _rollouts(tokenizer, n)
    theirs_policy = build_policy(tokenizer, seed=1)
    ours_policy = copy.deepcopy(theirs_policy)

    trl_trainer, trl = _trl_update(cfg, theirs_policy, tokenizer, data, responses, tmp_path, monkeypatch)
    value_model = trl_trainer.accelerator.unwrap_model(trl_trainer.model).value_model
    head = value_model.with_value_head.v_head.summary

    ours_trainer, ours = _ReplayingTrainer.build(cfg, ours_policy, tokenizer, list(trl["orders"]), monkeypatch)
    # TRL's value head starts random, ours at zero: start ours from TRL's weights before its update.
    ours_trainer.actor_critic.value_head.load_state_dict(trl["head_before"])
    stats = ours_trainer.step(data["input_ids"], responses, scores)
    gap = (
        (_logits(ours_trainer.policy, tokenizer, data, responses) - _logits(theirs_policy, tokenizer, data, responses))
        .abs()
        .max()
        .item()
    )
    return {
        "trl": trl,
        "ours": ours,
        "stats": stats,
        "trl_policy": theirs_policy,
        "ours_trainer": ours_trainer,
        "trl_head": head,
        "trl_critic": value_model.backbone,
        "logit_gap": gap,
    }


@pytest.mark.parametrize("separate_critic", [False, True], ids=["shared-critic", "separate-critic"])
def test_one_update_equals_trl(separate_critic, tokenizer, tmp_path, monkeypatch):
    result = _run_both(tokenizer, tmp_path, monkeypatch, separate_critic=separate_critic)
    trl, ours = result["trl"], result["ours"]
    assert len(trl["losses"]) == len(ours["losses"]) == 2 * 4  # epochs x minibatches
    for key in ("losses", "policy_losses", "value_losses"):
        np.testing.assert_allclose(ours[key], trl[key], atol=TOLERANCE, rtol=0, err_msg=key)
    log = next(entry for entry in trl["logs"] if "loss/policy_avg" in entry)
    for name in (
        "loss/policy_avg",
        "loss/value_avg",
        "policy/clipfrac_avg",
        "val/clipfrac_avg",
        "objective/kl",
        "objective/scores",
        "objective/non_score_reward",
        "objective/rlhf_reward",
    ):
        assert result["stats"][name] == pytest.approx(log[name], abs=TOLERANCE), name
    assert max(log["policy/clipfrac_avg"], log["val/clipfrac_avg"]) > 0  # the clipping paths were exercised
    trainer = result["ours_trainer"]
    # Eight Adam steps at lr 1e-4: on one CPU every element agreed within 1e-5; on another (AMD EPYC, AVX-512) one
    # element of 210k differed by 2.9e-5 and the logits by 1.2e-5 (tests/weight_gaps.py says why).
    assert_same_adam_steps(_weights(trainer.policy), _weights(result["trl_policy"]))
    assert result["logit_gap"] < 5 * TOLERANCE
    assert (
        _max_difference(
            _weights(trainer.actor_critic.value_head),
            {"weight": result["trl_head"].weight, "bias": result["trl_head"].bias},
        )
        < TOLERANCE
    )
    if separate_critic:
        assert (
            _max_difference(_weights(trainer.actor_critic.critic_backbone), _weights(result["trl_critic"])) < TOLERANCE
        )


def test_whitened_rewards_update_equals_trl(tokenizer, tmp_path, monkeypatch):
    # TRL refuses to whiten rewards over fewer than 8 rollouts a minibatch
    result = _run_both(tokenizer, tmp_path, monkeypatch, whiten_rewards=True, num_mini_batches=2)
    for key in ("losses", "policy_losses", "value_losses"):
        np.testing.assert_allclose(result["ours"][key], result["trl"][key], atol=TOLERANCE, rtol=0, err_msg=key)


def test_our_default_score_position_differs_from_trl(tokenizer, tmp_path, monkeypatch):
    """The option is what makes the updates equal: with the score on the last token they differ."""
    result = _run_both(tokenizer, tmp_path, monkeypatch, score_position="last_token")
    gap = np.abs(np.array(result["ours"]["value_losses"]) - np.array(result["trl"]["value_losses"])).max()
    assert gap > 1e-3
