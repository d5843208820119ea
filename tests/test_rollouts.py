"""The rollout seam (trl_ext.rollouts): which rollout a trainer builds, the one record's checks, and a rollout of
one's own given as an object, whose record is the only thing the trainer reads."""

import pytest
import torch

from trl_ext.errors import InputError
from trl_ext.rollouts import ROLLOUTS, Rollout, RolloutBatch, build_rollout
from trl_ext.rollouts.rollout_func import RolloutFunction
from trl_ext.rollouts.single_turn import SingleTurn
from trl_ext.rollouts.tool_loop import ToolLoop


def multiply(a: int, b: int) -> int:
    """Multiply two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


def test_the_trainer_arguments_pick_the_rollout():
    assert isinstance(build_rollout(), SingleTurn) and isinstance(build_rollout("single_turn"), SingleTurn)
    assert isinstance(build_rollout(tools=[multiply]), ToolLoop)
    assert isinstance(build_rollout(rollout_func=lambda prompts, trainer: {}), RolloutFunction)
    mine = SingleTurn()
    assert build_rollout(mine) is mine
    assert "single_turn" in ROLLOUTS


def test_two_makers_of_one_rollout_are_refused():
    with pytest.raises(InputError, match="rollout_func makes the whole rollout"):
        build_rollout(tools=[multiply], rollout_func=lambda prompts, trainer: {})
    with pytest.raises(InputError, match="each make the rollout: give one of them"):
        build_rollout(SingleTurn(), tools=[multiply])
    with pytest.raises(InputError, match="unknown rollout 'nope'"):
        build_rollout("nope")


def test_a_factory_that_makes_no_rollout_is_named(tmp_path):
    (tmp_path / "mine.py").write_text("def not_a_rollout():\n    return 3\n")
    with pytest.raises(InputError, match="made a int, which has no rollout"):
        build_rollout(f"{tmp_path / 'mine.py'}:not_a_rollout")


def _record(**overrides):
    ids = torch.tensor([[5, 6, 2], [7, 2, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    fields = dict(
        query_ids=torch.ones(2, 2, dtype=torch.long),
        query_mask=torch.ones(2, 2, dtype=torch.long),
        responses=ids,
        loss_mask=mask,
        attention_mask=mask,
        prompts=["a", "b"],
        completions=["x", "y"],
        completion_ids=[[5, 6, 2], [7, 2]],
    )
    return RolloutBatch(**{**fields, **overrides})


def test_the_record_refuses_what_does_not_fit():
    assert len(_record()) == 2
    with pytest.raises(InputError, match="turn_rewards is \\(2, 2\\), its responses \\(2, 3\\)"):
        _record(turn_rewards=torch.zeros(2, 2))
    with pytest.raises(InputError, match="1 prompts for 2 responses"):
        _record(prompts=["a"])
    with pytest.raises(InputError, match="loss mask marks a token its attention mask leaves out"):
        _record(attention_mask=torch.tensor([[1, 1, 0], [1, 1, 0]]))


def test_rates_over_counters_summed_elsewhere():
    record = _record(
        counters={"calls": 3, "failures": 1, "rollouts": 2},
        rates={"tools/failure_frequency": ("failures", "calls"), "tools/calls": ("calls", None)},
    )
    assert record.rollout_metrics({"calls": 6, "failures": 3, "rollouts": 4}) == {
        "tools/failure_frequency": 0.5,
        "tools/calls": 6,
    }
    assert record.rollout_metrics({"calls": 0, "failures": 0, "rollouts": 4})["tools/failure_frequency"] == 0.0


def test_an_own_rollout_object_is_all_the_trainer_reads(tokenizer):
    """A rollout that replays the single-turn one and counts its calls: one rollout a batch, its reward reaches
    scoring, its counters become metrics; the trainer holds no second path."""
    from datasets import Dataset

    from trl_ext.ppo import PPOTrainer
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    class Counting(Rollout):
        def __init__(self):
            self.calls, self.batches = 0, []
            self.reward_funcs = [lambda completions, **_: [float(len(c)) for c in completions]]

        def rollout(self, rows, sampling):
            self.calls += 1
            batch = SingleTurn().rollout(rows, sampling)
            batch.counters, batch.rates = {"rows": len(batch)}, {"mine/rows": ("rows", None)}
            self.batches.append(batch)
            return batch

    data = ppo_prompt_dataset(tokenizer, 8, seed=1)
    prompts = [tokenizer.decode(ids) for ids in data["input_ids"][:4]]
    mine = Counting()
    trainer = PPOTrainer(
        build_policy(tokenizer, seed=1),
        args=doubling_ppo_config(batch_size=4, total_episodes=8, response_length=6),
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": prompts * 2}),
        rollout=mine,
    )
    trained_on, update = [], trainer._update

    def spy(exp, forward=None):
        trained_on.append(exp.responses.clone())
        return update(exp, forward)

    trainer._update = spy
    history = trainer.train()
    assert mine.calls == 2 and len(history) == 2
    assert all(s["mine/rows"] == 4 for s in history)
    for stats, batch, responses in zip(history, mine.batches, trained_on, strict=True):
        # the rollout's reward scored its completions, and the update trained on its record
        lengths = sum(len(c) for c in batch.completions) / 4
        assert stats["objective/scores"] == pytest.approx(lengths) and stats["rewards/<lambda>/mean"] == pytest.approx(
            lengths
        )
        assert torch.equal(responses, batch.responses)
