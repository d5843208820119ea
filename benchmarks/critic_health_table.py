"""The critic's health beside the scores: for each row of a results file whose curve logged it, per seed, the median
over updates 5 and later (issue 80's window: the critic has had four updates to start) of the batch's explained
variance, the explained variance pooled over the last updates (``trl_ext.ppo.critic_health``), and the first value's
correlation with the return; and each row's mean over its seeds, beside its mean held-out score."""

from __future__ import annotations

from statistics import median

FIRST_UPDATE = 5  # updates 1-4 are the critic's start, left out of its health
METRICS = (
    ("explained_variance", "explained variance"),
    ("explained_variance_pooled", "pooled"),
    ("first_value_return_corr", "first value ~ return"),
)


def row_health(row: dict) -> dict[str, float] | None:
    """A row's medians over updates ``FIRST_UPDATE`` on; None where its curve logged no pooled explained variance."""
    window = [c for c in row.get("curve", []) if c["update"] >= FIRST_UPDATE and "explained_variance_pooled" in c]
    if not window:
        return None
    return {key: median(c[key] for c in window) for key, _ in METRICS}


def health_table(data: dict) -> list[str]:
    """The table's lines (none where no row logged the critic's health)."""
    healthy = [(r, h) for r in data["rows"] if (h := row_health(r)) is not None]
    if not healthy:
        return []
    names = " | ".join(f"{label}, per seed" for _, label in METRICS)
    lines = [
        f"The critic's health: medians over updates {FIRST_UPDATE} and later, each seed's in turn (seeds in the order "
        "shown), and the row's mean over its seeds.",
        "",
        f"| row | seeds | {names} | mean pooled | mean score after |",
        "|---|---|" + "---|" * len(METRICS) + "---|---|",
    ]
    for trainer in dict.fromkeys(r["trainer"] for r, _ in healthy):
        rows = [(r, h) for r, h in healthy if r["trainer"] == trainer]
        cells = " | ".join(" / ".join(f"{h[key]:.2f}" for _, h in rows) for key, _ in METRICS)
        pooled = sum(h["explained_variance_pooled"] for _, h in rows) / len(rows)
        score = sum(r["after"] for r, _ in rows) / len(rows)
        seeds = ",".join(str(r["seed"]) for r, _ in rows)
        lines.append(f"| {trainer} | {seeds} | {cells} | {pooled:.2f} | {score:.3f} |")
    return [*lines, ""]
