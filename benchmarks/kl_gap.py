"""The KL gap between the backends, and what closes it: the value head's initialisation.

    OMP_NUM_THREADS=1 python benchmarks/kl_gap.py      # about 15 minutes on 2 CPU cores

Runs ``trl-ext compare`` at 6,400 episodes (the demo's budget when measured; 3 seeds, both backends) four times
into runs/kl_gap (one pretrained policy and classifier for all): the value head at ``nn.Linear``'s
random init (``--value-head-init linear``: TRL's own, now our default) or at zero (our earlier
default), each with a shared critic (the earlier default) and a separate one (now the doubling
default). Writes benchmarks/results/kl-gap-<device>.json (peak and final KL, exact-match, per seed)
and benchmarks/results/kl-gap-<device>.png (KL to the reference per update, every run).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INITS = ("linear", "zero")
CRITICS = ("shared", "separate")


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "runs/kl_gap"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=6400)
    parser.add_argument("--extra", default="", help="extra trl-ext compare flags, in one quoted string")
    args = parser.parse_args(argv)

    from trl_ext.commands.cli import main as cli
    from trl_ext.runs.machine import device_tag, machine

    runs = []
    out = Path(args.out)
    for critic in CRITICS:
        for init in INITS:
            code = cli(
                [
                    "compare",
                    "--out",
                    str(out),
                    "--seeds",
                    str(args.seeds),
                    "--backends",
                    "trl,scratch",
                    "--total-episodes",
                    str(args.episodes),
                    "--value-head-init",
                    init,
                    "--separate-critic",
                    str(critic == "separate").lower(),
                    "--overwrite",
                    *shlex.split(args.extra),
                ]
            )
            if code:
                return code
            runs += _harvest(out, critic, init)
    info = machine()
    device = device_tag(info)
    stem = ROOT / "benchmarks" / "results" / f"kl-gap-{device}"
    _plot(runs, stem.with_suffix(".png"))
    stem.with_suffix(".json").write_text(
        json.dumps({"benchmark": "kl_gap", "machine": info, "episodes": args.episodes, "runs": runs}, indent=2) + "\n"
    )
    print(f"{'critic':8} {'init':7} {'backend':8} seed  peak KL (episode)  final KL  greedy  sampled")
    for r in runs:
        print(
            f"{r['critic']:8} {r['value_head_init']:7} {r['backend']:8} {r['seed']:4}  {r['peak_kl']:6.2f} "
            f"({r['peak_at_episode']:5})    {r['final_kl']:6.2f}  {r['greedy_exact']:6.3f}  {r['sampled_exact']:7.3f}"
        )
    from benchmarks.tables import invocation, write

    write(stem.with_suffix(".md"), results_table(stem.with_suffix(".json"), invocation()))
    print(f"written {stem}.json, .md and .png")
    return 0


def _harvest(out: Path, critic: str, init: str) -> list[dict]:
    """Each run of the compare just finished in ``out``, with its KL curve (the next compare overwrites them)."""
    runs = []
    results = json.loads((out / "results.json").read_text())
    for backend, rows in results["backends"].items():
        for offset, row in enumerate(rows):
            seed = results["config"]["train"]["seed"] + offset
            history = [
                json.loads(line) for line in (out / f"{backend}_seed{seed}" / "metrics.jsonl").read_text().splitlines()
            ]
            kl = [h["objective/kl"] for h in history]
            runs.append(
                {
                    "critic": critic,
                    "backend": backend,
                    "value_head_init": init,
                    "seed": seed,
                    "peak_kl": max(kl),
                    "peak_at_episode": history[kl.index(max(kl))]["episode"],
                    "final_kl": kl[-1],
                    "greedy_exact": row["greedy_exact"],
                    "sampled_exact": row["sampled_exact"],
                    "curve": [[h["episode"], k] for h, k in zip(history, kl)],
                }
            )
    return runs


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(CRITICS), len(INITS), figsize=(11, 7), sharex=True, sharey=True)
    colours = {"trl": "tab:blue", "scratch": "tab:orange"}
    for row, critic in enumerate(CRITICS):
        for col, init in enumerate(INITS):
            ax = axes[row][col]
            for r in (r for r in runs if r["value_head_init"] == init and r["critic"] == critic):
                episodes, kl = zip(*r["curve"])
                ax.plot(
                    episodes,
                    kl,
                    color=colours[r["backend"]],
                    alpha=0.8,
                    linestyle=("-", "--", ":")[r["seed"] % 3],
                    label=f"{r['backend']} seed {r['seed']}",
                )
            ax.set_title(f"{critic} critic, value head init: {init}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("episode")
    for ax in axes[:, 0]:
        ax.set_ylabel("KL(policy || ref), nats")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def results_table(name, made_by: str) -> str:
    """The file's table: per critic, value head init and backend, each seed's peak and final KL and accuracies."""
    from benchmarks.tables import load, source_line

    data = load(name)
    groups: dict[tuple, list] = {}
    for run in data["runs"]:
        groups.setdefault((run["critic"], run["value_head_init"], run["backend"]), []).append(run)
    lines = [
        source_line(name, made_by) + f" {data.get('episodes', 0):,} episodes a run.",
        "",
        "| critic | value head init | backend | peak KL, per seed | final KL | sampled exact | greedy exact |",
        "|---|---|---|---|---|---|---|",
    ]
    for (critic, init, backend), runs in groups.items():
        runs = sorted(runs, key=lambda r: r["seed"])
        lines.append(
            f"| {critic} | {init} | {backend} | "
            + " | ".join(
                " / ".join(f"{r[key]:.{digits}f}" for r in runs)
                for key, digits in (("peak_kl", 2), ("final_kl", 2), ("sampled_exact", 3), ("greedy_exact", 3))
            )
            + " |"
        )
    seeds = sorted({r["seed"] for r in data["runs"]})
    lines += [
        "",
        f"Seeds {' / '.join(map(str, seeds))} in each cell.",
        "",
        f"![KL to the reference, every run](../benchmarks/results/{Path(name).stem}.png)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
