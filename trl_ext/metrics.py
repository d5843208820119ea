"""What of one update's stats is a metric: the one filter the trainer's tracker log and the run logs share."""

from __future__ import annotations


def numeric_metrics(stats: dict) -> dict:
    """The numbers of one update's stats (our trainer's or a TRL trainer's logs). Text, such as the
    (prompt, completion) samples our trainer adds, is left out; so are booleans."""
    return {k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
