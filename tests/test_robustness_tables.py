"""benchmarks/robustness.py's table: the numbers as the docs quote them."""

from benchmarks.robustness import _table


def test_median_episodes_read_as_counts_and_a_row_that_never_reached_reads_a_dash():
    summary = {
        "ppo": {"runs": 2, "successes": 2, "success_rate": 1.0, "median_episodes_to_0_99": 2560.0, "failures": []},
        "grpo": {"runs": 1, "successes": 0, "success_rate": 0.0, "median_episodes_to_0_99": None, "failures": ["x"]},
    }
    lines = _table(summary, []).splitlines()
    assert lines[2] == "| ppo | 2 | 2 (100%) | 2,560 | none |"
    assert lines[3] == "| grpo | 1 | 0 (0%) | - | x |"
