"""Issue 51's verdicts (benchmarks/critic_verdicts.py): rows of several tasks compare task and seed for task and
seed, never one task's row against another's at the same seed."""

from benchmarks.critic_verdicts import BETTER, at_least, judgement_lines, selection_line
from benchmarks.harness import invocation_ratios
from benchmarks.public_tasks_tables import critic_targets

SCORES = {  # (task, seed): after, per trainer
    "ppo-combination": {("a", 1): 0.8, ("a", 2): 0.4, ("a", 3): 0.7, ("b", 1): 0.6, ("b", 2): 0.6, ("b", 3): 0.2},
    "grpo": {("a", 1): 0.5, ("a", 2): 0.5, ("a", 3): 0.5, ("b", 1): 0.5, ("b", 2): 0.5, ("b", 3): 0.5},
    "trl-grpo": {("a", 1): 0.7, ("a", 2): 0.5, ("a", 3): 0.6, ("b", 1): 0.7, ("b", 2): 0.5, ("b", 3): 0.3},
}
SECONDS = {"ppo-combination": 12.0, "grpo": 10.0, "trl-grpo": 30.0}


def _rows(seconds_by_task=None):
    return [
        {
            "trainer": trainer,
            "task": task,
            "seed": seed,
            "after": after,
            "invocation": "i",
            "seconds_per_update": (seconds_by_task or {}).get((trainer, task), SECONDS[trainer]),
        }
        for trainer, scores in SCORES.items()
        for (task, seed), after in scores.items()
    ]


def test_the_judgement_pools_task_and_seed_pairs_and_faces_the_better_group_row():
    lines = judgement_lines(_rows(), "ppo-combination", ["grpo", "trl-grpo"], (2, 3), "trl-grpo", "grpo")
    assert lines == [
        "| ppo-combination >= trl-grpo (the better GRPO row) on the mean, a:1, a:2, a:3, b:1, b:2, b:3 | "
        "0.550 vs 0.550 | yes |",
        "| ppo-combination ahead of trl-grpo on at least 4 of 6 task-seed pairs | 3 | no |",  # a:1, a:3, b:2
        "| ppo-combination s/update <= 1.25x grpo's, invocation i | 1.20x | yes |",
    ]
    task_a = [r for r in _rows() if r["task"] == "a"]
    assert judgement_lines(task_a, "ppo-combination", ["grpo", "trl-grpo"], (2, 3), "trl-grpo", None)[1] == (
        "| ppo-combination ahead of trl-grpo on at least 2 of 3 seeds | 2 | yes |"
    )
    assert judgement_lines(_rows(), "ppo", ["grpo"], (2, 3), None, "grpo") == []  # no such row: no verdict
    # the rival has not run: the mean against the rows that did, no count against a row the target does not name
    no_trl = [r for r in _rows() if r["trainer"] != "trl-grpo"]
    lines = judgement_lines(no_trl, "ppo-combination", ["grpo"], (3, 4), "trl-grpo", None)
    assert len(lines) == 1 and "(the better GRPO row) on the mean" in lines[0]


def test_ties_are_no_float_accident_and_no_row_order():
    def rows(scores):
        return [
            {"trainer": t, "task": "a", "seed": s, "after": a, "invocation": "i", "seconds_per_update": 1.0}
            for t, after in scores.items()
            for s, a in enumerate(after)
        ]

    level = rows({"ppo": [0.0312, 1.0], "grpo": [0.125, 0.9062]})  # equal sums, unequal floats
    assert judgement_lines(level, "ppo", ["grpo"], (1, 2), BETTER, None)[0].endswith("| 0.516 vs 0.516 | yes |")
    # two group rows level on the mean: the better is the one PPO is ahead of least often, whatever the order
    scores = {"ppo": [0.5, 0.58], "grpo": [0.4, 0.6], "trl-grpo": [0.45, 0.55]}  # PPO ahead of grpo once, TRL's twice
    for order in (["grpo", "trl-grpo"], ["trl-grpo", "grpo"]):
        lines = judgement_lines(rows(scores), "ppo", order, (1, 2), BETTER, None)
        assert lines[1] == "| ppo ahead of grpo on at least 1 of 2 seeds | 1 | yes |"
    tie = rows({"ppo": [0.5, 0.5], "grpo": [0.5, 0.4]})  # a seed level with the rival is not ahead of it
    assert judgement_lines(tie, "ppo", ["grpo"], (2, 2), BETTER, None)[1].endswith("| 1 | no |")


def test_seconds_compare_task_for_task_at_the_same_seed():
    slow_b = {("ppo-combination", "b"): 30.0}  # task b's PPO rows slower: not hidden behind task a's at that seed
    (found,) = invocation_ratios(_rows(slow_b), "ppo-combination", "grpo")
    assert found["seconds_per_update"] == {"ppo-combination": 21.0, "grpo": 10.0}
    assert found["per_seed"]["a:1"] == 1.2 and found["per_seed"]["b:1"] == 3.0 and len(found["per_seed"]) == 6


def test_the_selection_rule_and_the_share_of_seeds():
    rows = [r for r in _rows() if r["task"] == "a" and r["trainer"] != "trl-grpo"]
    assert selection_line(rows, "ppo-combination", "grpo").endswith("0.633 vs 0.500 (+0.133), ahead on 2 of 3 | yes |")
    assert selection_line(rows, "ppo-combination", "ppo") is None
    assert [at_least((2, 3), n) for n in (3, 4, 6)] == [2, 3, 4] and at_least((3, 4), 4) == 3


def test_the_public_task_table_judges_over_every_task_then_each():
    tables = critic_targets(_rows())
    assert [t.splitlines()[0] for t in tables] == [
        "| target (issue 51), every task | measured | met |",
        "| target (issue 51), `a` | measured | met |",
        "| target (issue 51), `b` | measured | met |",
    ]
    assert "s/update" in tables[0] and "s/update" not in tables[1]  # seconds once, over every task
    assert critic_targets([r for r in _rows() if r["trainer"] != "ppo-combination"]) == []  # not item 5's run
