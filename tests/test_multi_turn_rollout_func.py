"""``rollout_func`` (TRL's contract): the user's function makes the rollouts; ``env_mask`` marks the model's tokens.
With no environment tokens the update is today's single-turn update to 1e-6."""

import pytest
import torch

from trl_ext.errors import InputError


def _setup(tokenizer, **options):
    from datasets import Dataset

    from trl_ext.ppo import PPOTrainer
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    data = ppo_prompt_dataset(tokenizer, 16, seed=3)
    prompts = [tokenizer.decode(ids) for ids in data["input_ids"][:2]]
    config = doubling_ppo_config(
        **{
            **dict(
                num_generations=2,
                batch_size=4,
                total_episodes=4,
                num_ppo_epochs=2,
                num_mini_batches=1,
                response_length=8,
                learning_rate=1e-3,
                max_grad_norm=1.0,
            ),
            **options,
        }
    )

    def build(**extra):
        return PPOTrainer(
            build_policy(tokenizer, seed=1),
            args=config,
            processing_class=tokenizer,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            **extra,
        )

    return build, prompts


COMPLETIONS = ["12E", "二四E", "46", "8E"]
SCORES = [1.0, -0.5, 0.2, 0.7]


@pytest.mark.parametrize("estimator", ["gae", "grpo", "rloo", "reinforce_pp"])
def test_a_rollout_func_without_environment_tokens_updates_as_today(tokenizer, estimator):
    build, prompts = _setup(tokenizer, advantage_estimator=estimator)
    completion_ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in COMPLETIONS]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(2)]
    calls = []

    def rollout_func(given, trainer):
        calls.append(given)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None, "score": SCORES}

    def score(completions, score, **_):
        return score

    ours = build(rollout_func=rollout_func, reward_funcs=[score])
    stats = ours.train()[0]
    assert calls == [prompts]  # each prompt once; the function returns num_generations completions each
    today = build()
    reference = today.step(prompt_ids, completion_ids, SCORES)
    for name, value in reference.items():
        if isinstance(value, float):
            assert stats[name] == pytest.approx(value, abs=1e-6), name
    gap = max((p - q).abs().max().item() for p, q in zip(ours.policy.parameters(), today.policy.parameters()))
    assert gap < 1e-6
    assert stats["turns/per_rollout"] == 1.0 and stats["tokens/environment_per_rollout"] == 0.0


def test_env_mask_leaves_environment_tokens_out_of_the_loss(tokenizer):
    build, prompts = _setup(tokenizer, advantage_estimator="gae")
    completion_ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in ["1234E", "567E", "78E", "89E"]]
    env_mask = [[0 if i == 1 else 1 for i in range(len(ids))] for ids in completion_ids]  # the second token
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(2)]
    captured = {}
    trainer = build(
        rollout_func=lambda given, trainer: {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": None,
            "env_mask": env_mask,
        },
        reward_funcs=[lambda completions, **_: [1.0, 0.0, 0.5, 0.2]],
    )
    real = trainer._update

    def spy(exp, forward=None):
        captured["exp"] = exp
        return real(exp, forward)

    trainer._update = spy
    stats = trainer.train()[0]
    exp = captured["exp"]
    assert stats["tokens/environment_per_rollout"] == 1.0 and stats["val/response_length"] == 2.75
    assert stats["turns/per_rollout"] == 2.0  # model tokens, one environment token, model tokens: two turns
    plus = torch.zeros_like(exp.mask, dtype=torch.bool)
    plus[:, 1] = True
    assert exp.mask[plus].sum() == 0 and exp.attention_mask[:, exp.query_length :][plus].all()
    assert (
        exp.outcome.advantages[plus].abs().sum() == 0
        and exp.outcome.advantages[~plus & exp.mask.bool()].abs().sum() > 0
    )


def test_a_rollout_funcs_bad_output_is_one_clear_error(tokenizer):
    build, _ = _setup(tokenizer)
    reward = [lambda completions, **_: [0.0] * 4]
    with pytest.raises(InputError, match="keys prompt_ids, completion_ids, logprobs"):
        build(rollout_func=lambda given, trainer: {"completion_ids": []}, reward_funcs=reward).train()
    with pytest.raises(InputError, match="returned 2 completion_ids for 4 completions"):
        build(
            rollout_func=lambda given, trainer: {
                "prompt_ids": [[1]] * 4,
                "completion_ids": [[1], [2]],
                "logprobs": None,
            },
            reward_funcs=reward,
        ).train()
    with pytest.raises(InputError, match="no model token"):
        build(
            rollout_func=lambda given, trainer: {
                "prompt_ids": [[1]] * 4,
                "completion_ids": [[1]] * 4,
                "logprobs": None,
                "env_mask": [[0]] * 4,
            },
            reward_funcs=reward,
        ).train()


def test_the_sampler_logprobs_of_a_rollout_func_reach_the_record(tokenizer):
    build, prompts = _setup(tokenizer)
    completion_ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in COMPLETIONS]
    # a value of its own at every row and position: a shift or a swap would show
    logprobs = [[-0.1 * (row + 1) - 0.01 * t for t in range(len(ids))] for row, ids in enumerate(completion_ids)]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(2)]
    trainer = build(
        rollout_func=lambda given, trainer: {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": logprobs,
        },
        reward_funcs=[lambda completions, **_: SCORES],
    )
    captured, update = {}, trainer._update

    def spy(exp, forward=None):
        captured["exp"] = exp
        return update(exp, forward)

    trainer._update = spy
    stats = trainer.train()[0]
    exp = captured["exp"]
    for row, (ids, given) in enumerate(zip(completion_ids, logprobs)):
        assert exp.responses[row, : len(ids)].tolist() == ids and exp.mask[row, : len(ids)].all()
        assert exp.sampling_logprobs[row, : len(ids)].tolist() == pytest.approx(given, abs=1e-7)
    gap = (exp.old_logprobs - exp.sampling_logprobs).abs()[exp.mask.bool()]  # the trainer's own minus the given
    assert stats["sampling/sampling_logp_difference/mean"] == pytest.approx(gap.mean().item(), rel=1e-6)
    assert stats["sampling/sampling_logp_difference/max"] == pytest.approx(gap.max().item(), rel=1e-6)
