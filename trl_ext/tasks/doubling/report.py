"""Rendering the doubling pipeline's results: rows from run summaries, a terminal table, ``report.md``, a PNG of
learning curves, and the machine they came from."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from trl_ext.runs.machine import machine

COLUMNS = (
    ("backend", "backend", "{}"),
    ("greedy exact", "greedy_exact", "{:.3f}"),
    ("sampled exact", "sampled_exact", "{:.3f}"),
    ("episodes to 0.99", "episodes_to_target", "{:.0f}"),
    ("seconds to 0.99", "seconds_to_target", "{:.1f}"),
    ("episodes/s", "episodes_per_second", "{:.1f}"),
    ("train s", "train_seconds", "{:.1f}"),
    ("final KL", "final_kl", "{:.3f}"),
)


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, dict):  # mean and spread over seeds
        if value.get("mean") is None:
            return "-"
        return (
            (fmt.format(value["mean"]) + " ± " + fmt.format(value["std"]))
            if value.get("n", 1) > 1
            else fmt.format(value["mean"])
        )
    return fmt.format(value)


def table_rows(rows: list[dict]) -> list[list[str]]:
    return [[title for title, _, _ in COLUMNS]] + [[_cell(r.get(key), fmt) for _, key, fmt in COLUMNS] for r in rows]


def not_run_notes(rows: list[dict]) -> list[str]:
    """One line per row that could not run (``{"backend", "not_run"}``), saying why and how to get it."""
    return [f"{r['backend']}: not run. {r['not_run']}" for r in rows if r.get("not_run")]


def text_table(rows: list[dict]) -> str:
    cells = table_rows(rows)
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + not_run_notes(rows))


def markdown_table(rows: list[dict]) -> str:
    cells = table_rows(rows)
    out = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(row) + " |" for row in cells[1:]]
    notes = not_run_notes(rows)
    return "\n".join(out + ([""] + [f"* {n}" for n in notes] if notes else []))


def plot_curves(histories: dict[str, list[dict]], path: str | Path) -> Path:
    """Score, held-out requested-charset rate and KL against episodes, one line per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("objective/scores", "reward score"),
        ("probe/charset_acc", "requested-charset rate (held-out)"),
        ("objective/kl", "KL to reference"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4))
    for ax, (key, title) in zip(axes, panels):
        for name, history in histories.items():
            points = [(h["episode"], h[key]) for h in history if key in h and h.get("episode") is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, label=name, marker="o" if key.startswith("probe/") else None, markersize=3)
        ax.set_title(title)
        ax.set_xlabel("episodes")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary_row(summary: dict, label: str) -> dict:
    """The table's row of one ``ppo`` run, from its ``summary.json``."""
    reached = summary.get("reached_0_99") or {}
    return {
        "backend": label,
        "greedy_exact": summary["greedy"]["exact"],
        "sampled_exact": summary["sampled"]["exact"],
        "greedy_charset": summary["greedy"]["charset_acc"],
        "episodes_to_target": reached.get("episode"),
        "seconds_to_target": reached.get("train_seconds"),
        "episodes_per_second": summary["episodes_per_second"],
        "train_seconds": summary["train_seconds"],
        "final_kl": summary["final_kl"],
        "episodes": summary["episodes"],
    }


def aggregate_rows(rows: list[dict]) -> dict:
    """One row for several seeds' rows of a label: each number as mean, spread (population std) and count."""
    merged = {"backend": rows[0]["backend"]}
    for key in rows[0]:
        if key == "backend":
            continue
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        merged[key] = {
            "mean": statistics.fmean(values) if values else None,
            "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
            "n": len(values),
            "of": len(rows),
        }
    return merged


def write_report(out: Path, title: str, rows: list[dict], histories: dict, results: dict, notes: list[str]) -> None:
    """``results.json`` (with the rows and this machine), ``curves.png`` and ``report.md`` in ``out``."""
    results["rows"] = rows
    results["machine"] = machine()
    (out / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    plot_curves(histories, out / "curves.png")
    lines = [f"# {title}", "", markdown_table(rows), "", "![learning curves](curves.png)", "", *notes]
    (out / "report.md").write_text("\n".join(lines) + "\n")
