"""The parts the scratch trainer orchestrates, each on its own: reward scoring, the update's metrics across
ranks, prompt batches, the phase clock, and what the builder makes. (The learner's micro-batch weighting and
the one-forward path: tests/test_micro_batches.py and tests/test_one_forward_update.py.)"""

import time
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from trl_ext.errors import InputError
from trl_ext.ppo.advantages import Advantages
from trl_ext.ppo.experience import Experience
from trl_ext.rewards.scoring import RewardScorer, as_completions


def test_reward_scorer_sums_by_grpos_none_rule_and_reports_each_function():
    def length(completions, **kwargs):
        return [float(len(c)) for c in completions]

    def only_first(completions, **kwargs):
        return [1.0] + [None] * (len(completions) - 1)

    def logs(completions, log_metric, **kwargs):
        log_metric("custom/seen", len(completions))
        return [0.0] * len(completions)

    scorer = RewardScorer([length, only_first, logs], [1.0, 10.0, 1.0])
    rows = {"input_ids": [[1], [2]], "prompt": ["a", "b"]}
    scores, stats = scorer.score(rows, ["a", "b"], ["xy", "xyz"], [[5, 6], [5, 6, 7]], trainer_state=None)
    assert scores == [12.0, 3.0]  # the None of row 1 is left out, not counted as 0
    assert stats == {
        "rewards/length/mean": 2.5,
        "rewards/only_first/mean": 1.0,
        "rewards/logs/mean": 0.0,
        "custom/seen": 2.0,
    }
    assert scorer.score(rows, ["a", "b"], ["x", "y"], [[5], [6]], None)[1]["custom/seen"] == 2.0  # not accumulated
    with pytest.raises(InputError, match="reward_weights has 1 values for 3"):
        RewardScorer([length, only_first, logs], [1.0])


def test_completions_take_the_prompts_format():
    assert as_completions(["a"], ["x"]) == ["x"]
    assert as_completions([[{"role": "user", "content": "a"}]], ["x"]) == [[{"role": "assistant", "content": "x"}]]


class TwoRanks:
    """An accelerator whose gather stacks this rank's row with another rank's."""

    def __init__(self, other: torch.Tensor):
        self.other = other

    def gather(self, tensor):
        return torch.cat([tensor, self.other[None]])


def test_sampling_metrics_average_means_and_take_extremes_over_ranks():
    from trl_ext.ppo.update_metrics import sampling_metrics

    mask = torch.tensor([[1.0, 1.0, 0.0]])
    exp = Experience(
        query_response=None,
        attention_mask=None,
        position_ids=None,
        responses=None,
        mask=mask,
        old_logprobs=torch.tensor([[-1.0, -2.0, -9.0]]),
        ref_logprobs=None,
        outcome=None,
        sampling_logprobs=torch.tensor([[-1.5, -2.1, 0.0]]),  # the padded token's gap is not counted
        importance_weights=torch.tensor([[0.5, 2.0, 7.0]]),
    )
    other = torch.tensor([0.3, 0.3, 0.1, 1.0, 4.0])  # the other rank: gap mean/max, ratio min/mean/max
    metrics = sampling_metrics(exp, TwoRanks(other))
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx((0.3 + 0.3) / 2)
    assert metrics["sampling/sampling_logp_difference/max"] == pytest.approx(0.5)
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(0.1)
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx((1.25 + 1.0) / 2)
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(4.0)


def test_experience_minibatch_keeps_none_fields_none():
    outcome = Advantages(
        advantages=torch.arange(4.0),
        returns=None,
        values=None,
        scores=torch.arange(4.0),
        kl=torch.zeros(4),
        rewards=torch.zeros(4),
        non_score_rewards=torch.zeros(4),
        value_mask=torch.ones(4),
    )
    exp = Experience(
        torch.zeros(4, 2),
        torch.ones(4, 2),
        torch.zeros(4, 2),
        torch.zeros(4, 1),
        torch.ones(4, 1),
        torch.arange(4.0)[:, None],
        torch.zeros(4, 1),
        outcome,
    )
    mb = exp.minibatch(torch.tensor([3, 1]))
    assert mb.outcome.returns is None and mb.sampling_logprobs is None
    assert mb.outcome.scores.tolist() == [3.0, 1.0] and mb.old_logprobs[:, 0].tolist() == [3.0, 1.0]


class OneProcess:
    def prepare(self, loader):
        return loader


def test_prompt_batches_repeat_each_prompt_skip_and_cycle():
    from trl_ext.ppo.prompt_batches import prompt_batches

    data = Dataset.from_dict({"input_ids": [[i] for i in range(5)], "answer": list(range(5))})
    config = SimpleNamespace(batch_size=4, num_generations=2)
    batches = prompt_batches(data, config, OneProcess(), skip=1)
    assert next(batches)["answer"] == [2, 2, 3, 3]  # the second batch: a resumed run skips the first
    assert next(batches)["answer"] == [0, 0, 1, 1]  # 5 rows make 2 whole batches; then round again
    with pytest.raises(InputError, match="smaller than one batch"):
        prompt_batches(data, SimpleNamespace(batch_size=12, num_generations=1), OneProcess())


def test_phase_clock_laps_add_up():
    from trl_ext.ppo.timing import PhaseClock

    clock = PhaseClock(torch.device("cpu"))
    start = time.perf_counter()
    time.sleep(0.01)
    clock.lap("a")
    clock.lap("b")
    assert set(clock.timings) == {"timing/a", "timing/b"} and clock.timings["timing/a"] >= 0.01
    assert sum(clock.timings.values()) <= time.perf_counter() - start + 1e-3


def test_builder_copies_a_reference_only_where_a_kl_term_reads_it(tokenizer):
    from trl_ext.ppo import PPOConfig
    from trl_ext.ppo.builder import build_models
    from trl_ext.tasks.doubling.models import build_policy

    model, reference = build_models(build_policy(tokenizer), PPOConfig(kl_coef=0.0))
    assert reference is None and model.value_head is not None
    model, reference = build_models(build_policy(tokenizer), PPOConfig(kl_coef=0.1, advantage_estimator="grpo"))
    assert reference is not None and not any(p.requires_grad for p in reference.parameters())
    assert model.value_head is None  # critic-free: no value head
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # master weights


def test_the_optimizer_is_fused_on_a_gpu_and_foreach_elsewhere():
    """transformers' default on a GPU (so TRL's): fused AdamW, whose step makes no full-size temporaries; on CPU
    foreach, as every CPU result was measured. The device is only read at the first step, so a CUDA one can be
    named here."""
    from trl_ext.ppo.optimizers import build_optimizer

    model = torch.nn.Linear(3, 2)
    on_gpu = build_optimizer(model, 1e-3, torch.device("cuda")).defaults
    on_cpu = build_optimizer(model, 1e-3, torch.device("cpu")).defaults
    assert (on_gpu["fused"], on_gpu["foreach"]) == (True, False)
    assert (on_cpu["fused"], on_cpu["foreach"]) == (False, True)
    assert on_cpu["eps"] == 1e-8 and on_cpu["weight_decay"] == 0.0
