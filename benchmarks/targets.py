"""Every table of docs/results.md's doubling-task section, from the default pipeline, in one run.

    OMP_NUM_THREADS=1 python benchmarks/targets.py            # about 30 minutes on 2 CPU cores
    python benchmarks/targets.py --seeds 1 --extra "--total-episodes 128 --eval-n 20"   # the code path, quickly

Runs ``trl-ext compare`` (defaults: 19,200 episodes, 3 seeds, two PPO runs at a time) twice into
runs/targets, sharing the pretrained policy: first the backends with the charset classifier's reward
(trl, scratch; TRL's GRPO and RLOO, ours configured as them: scratch-grpo, scratch-rloo; scratch-reinforce_pp;
the best two-epoch critic-free settings found, run by both trainers: grpo-tuned, rloo-tuned, scratch-grpo-tuned,
scratch-rloo-tuned; the best one-step settings found: scratch-grpo-quick, scratch-rloo-quick), then both PPO
backends with the scalar reward model trained on the doubling preferences (rows ``trl+rm``, ``scratch+rm``).
Checks, on 1,000 held-out prefix prompts per seed:
  trl, scratch, scratch-rloo-tuned:  greedy exact >= 0.99 and sampled exact >= 0.98 (every seed)
  trl+rm, scratch+rm:  greedy exact >= 0.99 and sampled exact >= 0.99 (seed 0)
  our GRPO and RLOO at their one-step setting against TRL's GRPO and RLOO rows (scratch-grpo-quick vs
  grpo, scratch-rloo-quick vs rloo): greedy exact >= 0.99 and sampled exact >= TRL's on every seed, and
  episodes/s >= TRL's
and the speed targets: scratch episodes/s >= 3x trl's, scratch wall time to greedy 0.99 <= 1/3 of trl's,
each scratch-ALGO row's episodes/s >= its TRL row's with the same config, and scratch-rloo-tuned's training
time <= half of scratch's. Ours and TRL's trainer given the same config (scratch-grpo vs grpo, ...,
scratch-rloo-tuned vs rloo-tuned) compute the same update (tests/test_trl_group_equality.py), so which one a
seed favours is the sampling's luck: those pairs' accuracies are reported per seed (the sampled gap, greedy of
both), not checked.
Writes benchmarks/results/targets-<device>.json and its tables beside it (targets-<device>.summary.md, .stages.md,
.critic-free.md, .per-seed.md, .checks.md), which docs/results.md shows.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = (
    (
        "trl,scratch,grpo,rloo,scratch-grpo,scratch-rloo,scratch-reinforce_pp,grpo-tuned,rloo-tuned,"
        "scratch-grpo-tuned,scratch-rloo-tuned,scratch-grpo-quick,scratch-rloo-quick",
        "classifier",
    ),
    ("trl,scratch", "reward_model"),
)
# ours and TRL's critic-free trainer given one config: the same update, so compared (speed checked, accuracy reported)
SAME_AS_TRL = {
    "scratch-grpo": "grpo",
    "scratch-rloo": "rloo",
    "scratch-grpo-tuned": "grpo-tuned",
    "scratch-rloo-tuned": "rloo-tuned",
}
# our GRPO and RLOO at their one-step setting against TRL's GRPO and RLOO rows as TRL runs them
OURS_VS_TRLS_ROWS = {"scratch-grpo-quick": "grpo", "scratch-rloo-quick": "rloo"}
SAMPLED = {"trl": 0.98, "scratch": 0.98, "scratch-rloo-tuned": 0.98, "trl+rm": 0.99, "scratch+rm": 0.99}
COLUMNS = (
    "greedy_exact",
    "sampled_exact",
    "episodes_to_target",
    "seconds_to_target",
    "episodes_per_second",
    "train_seconds",
    "final_kl",
)


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "runs/targets"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--extra", default="", help="extra trl-ext compare flags, in one quoted string")
    args = parser.parse_args(argv)

    from trl_ext.commands.cli import main as cli
    from trl_ext.runs.machine import device_tag, machine

    per_seed, stages = {}, {}
    for backends, reward in RUNS:
        code = cli(
            [
                "compare",
                "--out",
                args.out,
                "--seeds",
                str(args.seeds),
                "--backends",
                backends,
                "--rewards",
                reward,
                "--overwrite",
                *shlex.split(args.extra),
            ]
        )
        if code:
            return code
        results = json.loads((Path(args.out) / "results.json").read_text())
        per_seed.update(results["backends"])
        stages.update(results["stages"])
    checks, comparisons = _checks(per_seed), _same_config_comparisons(per_seed)
    info = machine()
    device = device_tag(info)
    stem = ROOT / "benchmarks" / "results" / f"targets-{device}"
    stem.with_suffix(".json").write_text(
        json.dumps(
            {
                "benchmark": "targets",
                "machine": info,
                "checks": checks,
                "same_config_comparisons": comparisons,
                "per_seed": per_seed,
                "stages": {k: {n: v for n, v in s.items() if n != "config"} for k, s in stages.items()},
            },
            indent=2,
        )
        + "\n"
    )
    from benchmarks.tables import invocation

    write_tables(stem.with_suffix(".json"), invocation())
    for c in checks:
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}  ({c['value']})")
    print("\n".join(comparisons))
    print(f"written {stem}.json and its tables ({stem}.*.md)")
    return 0


def _checks(per_seed: dict) -> list[dict]:
    checks = []
    for label, rows in per_seed.items():
        if label not in SAMPLED or not isinstance(rows, list):
            continue
        for seed, row in enumerate(rows if "+rm" not in label else rows[:1]):
            checks.append(
                {
                    "check": f"{label} seed {seed}: greedy >= 0.99",
                    "value": row["greedy_exact"],
                    "ok": row["greedy_exact"] >= 0.99,
                }
            )
            checks.append(
                {
                    "check": f"{label} seed {seed}: sampled >= {SAMPLED[label]}",
                    "value": row["sampled_exact"],
                    "ok": row["sampled_exact"] >= SAMPLED[label],
                }
            )
    if isinstance(per_seed.get("trl"), list) and isinstance(per_seed.get("scratch"), list):
        eps = {b: statistics.fmean(r["episodes_per_second"] for r in per_seed[b]) for b in ("trl", "scratch")}
        checks.append(
            {
                "check": "scratch episodes/s >= 3x trl",
                "value": round(eps["scratch"] / eps["trl"], 2),
                "ok": eps["scratch"] >= 3 * eps["trl"],
            }
        )
        reach = {b: [r["seconds_to_target"] for r in per_seed[b]] for b in ("trl", "scratch")}
        if all(v is not None for vs in reach.values() for v in vs):
            ratio = statistics.fmean(reach["scratch"]) / statistics.fmean(reach["trl"])
            checks.append(
                {"check": "scratch seconds to 0.99 <= 1/3 of trl", "value": round(ratio, 3), "ok": ratio <= 1 / 3}
            )
    if isinstance(per_seed.get("scratch-rloo-tuned"), list) and isinstance(per_seed.get("scratch"), list):
        wall = {b: statistics.fmean(r["train_seconds"] for r in per_seed[b]) for b in ("scratch-rloo-tuned", "scratch")}
        ratio = wall["scratch-rloo-tuned"] / wall["scratch"]
        checks.append(
            {
                "check": "scratch-rloo-tuned train seconds <= 1/2 of scratch's (PPO)",
                "value": round(ratio, 3),
                "ok": ratio <= 0.5,
            }
        )
    for ours, theirs in _pairs(per_seed, {**SAME_AS_TRL, **OURS_VS_TRLS_ROWS}):
        eps = {b: statistics.fmean(r["episodes_per_second"] for r in per_seed[b]) for b in (ours, theirs)}
        checks.append(
            {
                "check": f"{ours} episodes/s >= {theirs}'s",
                "value": round(eps[ours] / eps[theirs], 2),
                "ok": eps[ours] >= eps[theirs],
            }
        )
    for ours, theirs in _pairs(per_seed, OURS_VS_TRLS_ROWS):  # every seed, ours against theirs
        for seed, (mine, trl) in enumerate(zip(per_seed[ours], per_seed[theirs], strict=True)):
            checks.append(
                {
                    "check": f"{ours} seed {seed}: greedy >= 0.99 and sampled >= {theirs}'s",
                    "value": f"{mine['greedy_exact']} / {mine['sampled_exact']} vs {trl['sampled_exact']}",
                    "ok": mine["greedy_exact"] >= 0.99 and mine["sampled_exact"] >= trl["sampled_exact"],
                }
            )
    return checks


def _pairs(per_seed: dict, pairs: dict) -> list[tuple[str, str]]:
    """The pairs of rows that both ran (a row not run holds a reason, not a list of seeds)."""
    return [
        (ours, theirs)
        for ours, theirs in pairs.items()
        if isinstance(per_seed.get(ours), list) and isinstance(per_seed.get(theirs), list)
    ]


def _same_config_comparisons(per_seed: dict) -> list[str]:
    """Per seed, which of two trainers proven to compute the same update ended ahead, and by how much; and greedy
    exact of both, which the targets ask to be >= 0.99."""
    lines = []
    for ours, theirs in _pairs(per_seed, SAME_AS_TRL):
        rows = list(zip(per_seed[ours], per_seed[theirs], strict=True))
        gaps = [mine["sampled_exact"] - trl["sampled_exact"] for mine, trl in rows]
        greedy = " / ".join(f"{mine['greedy_exact']:.3f} vs {trl['greedy_exact']:.3f}" for mine, trl in rows)
        lines.append(
            f"- {ours} vs {theirs} (same config), sampled exact ours - TRL's per seed: "
            f"{' / '.join(f'{gap:+.3f}' for gap in gaps)} (ours at or ahead on "
            f"{sum(gap >= 0 for gap in gaps)} of {len(gaps)}); greedy exact ours vs TRL's: {greedy}"
        )
    return lines


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{value:,}"


def _ran(data: dict) -> dict:
    return {label: rows for label, rows in data["per_seed"].items() if isinstance(rows, list)}


def summary_table(data: dict, name: str, made_by: str) -> str:
    from benchmarks.tables import source_line

    lines = [
        source_line(name, made_by),
        "",
        "| run | greedy exact, mean ± std | sampled exact, mean ± std | per seed (sampled) |",
        "|---|---|---|---|",
    ]
    for label, rows in data["per_seed"].items():
        if not isinstance(rows, list):
            lines.append(f"| {label} | not run: {rows.get('not_run')} | | |")
            continue
        greedy, sampled = [r["greedy_exact"] for r in rows], [r["sampled_exact"] for r in rows]
        lines.append(
            f"| {label} | {statistics.fmean(greedy):.3f} ± {statistics.pstdev(greedy):.3f} | "
            f"{statistics.fmean(sampled):.3f} ± {statistics.pstdev(sampled):.3f} | "
            + " / ".join(f"{v:.3f}" for v in sampled)
            + " |"
        )
    return "\n".join(lines)


CRITIC_FREE_LABELS = {
    "grpo": "TRL GRPOTrainer (`grpo`)",
    "scratch-grpo": "ours as it (`scratch-grpo`)",
    "rloo": "TRL RLOOTrainer (`rloo`)",
    "scratch-rloo": "ours as it (`scratch-rloo`)",
    "scratch-grpo-quick": "ours, `scratch-grpo-quick` (one step a batch)",
    "scratch-rloo-quick": "ours, `scratch-rloo-quick` (one step a batch)",
    "scratch-reinforce_pp": "ours, `scratch-reinforce_pp`",
    "grpo-tuned": "TRL GRPOTrainer, tuned (`grpo-tuned`)",
    "scratch-grpo-tuned": "ours, `scratch-grpo-tuned`",
    "rloo-tuned": "TRL RLOOTrainer, tuned (`rloo-tuned`)",
    "scratch-rloo-tuned": "ours, `scratch-rloo-tuned`",
    "scratch": "ours, PPO (`scratch`, separate critic)",
}


def critic_free_table(data: dict) -> str:
    rows = _ran(data)
    lines = [
        "Seeds 0 / 1 / 2 (from the run above):",
        "",
        "| row | sampled exact | greedy exact | episodes/s | training s (two runs side by side) |",
        "|---|---|---|---|---|",
    ]
    for label, text in CRITIC_FREE_LABELS.items():
        if label in rows:
            lines.append(
                f"| {text} | "
                + " | ".join(
                    " / ".join(fmt(r[key]) for r in rows[label])
                    for key, fmt in (
                        ("sampled_exact", lambda v: f"{v:.3f}"),
                        ("greedy_exact", lambda v: f"{v:.3f}"),
                        ("episodes_per_second", lambda v: f"{v:.0f}"),
                        ("train_seconds", lambda v: f"{v:.0f}"),
                    )
                )
                + " |"
            )
    return "\n".join(lines)


def per_seed_table(data: dict) -> str:
    lines = [
        "| run | seed | " + " | ".join(c.replace("_", " ") for c in COLUMNS) + " |",
        "|" + "---|" * (len(COLUMNS) + 2),
    ]
    for label, per in _ran(data).items():
        lines += [
            f"| {label} | {seed} | " + " | ".join(_cell(row.get(c)) for c in COLUMNS) + " |"
            for seed, row in enumerate(per)
        ]
    return "\n".join(lines)


def checks_table(data: dict) -> str:
    checks = data["checks"]
    lines = [f"{sum(c['ok'] for c in checks)} of {len(checks)} checks pass:", ""]
    lines += [f"- {'PASS' if c['ok'] else '**FAIL**'} {c['check']} ({c['value']})" for c in checks]
    if data.get("same_config_comparisons"):
        lines += ["", "Ours and TRL's trainer given the same config (reported, not checked):", ""]
        lines += [line if line.startswith("- ") else f"- {line}" for line in data["same_config_comparisons"]]
    return "\n".join(lines)


def stages_table(data: dict) -> str:
    from benchmarks.tables import fmt

    stages = data["stages"]
    lines = ["| stage | seconds | figures |", "|---|---|---|"]
    policy = stages.get("policy")
    if policy:
        spread = policy.get("charset_spread", {})
        lines.append(
            f"| pretraining (`pretrain`, {policy.get('processes', 1)} processes) | {fmt(policy['seconds'], 1)} "
            f"| greedy value_acc {fmt(policy['value_acc'])}, sampled {fmt(policy['sampled_value_acc'])}; "
            "charsets written: " + ", ".join(f"{k} {fmt(v)}" for k, v in spread.items()) + " |"
        )
    reward = stages.get("reward")
    if reward:
        lines.append(
            f"| charset classifier (`train-reward`) | {fmt(reward['seconds'], 1)} | held-out accuracy "
            f"{fmt(reward['heldout_accuracy'])} |"
        )
    rm = stages.get("reward_model")
    if rm:
        kinds = ", ".join(f"{k.replace('_', ' ')} {fmt(v)}" for k, v in rm.get("heldout_by_kind", {}).items())
        scores = rm.get("heldout_scores", {})
        score_text = "; ".join(
            f"{k} scores {scores[k]['mean']:.2f} ± {scores[k]['std']:.2f}"
            for k in ("chosen", "rejected")
            if k in scores
        )
        lines.append(
            f"| reward model (`train-reward-model`) | {fmt(rm['seconds'], 1)} | held-out pairwise "
            f"{fmt(rm['heldout_pairwise_accuracy'])} on {fmt(rm.get('heldout_pairs'))} pairs; by kind: "
            f"{kinds}; {score_text} |"
        )
    return "\n".join(lines)


def write_tables(name, made_by: str) -> None:
    """The tables docs/results.md shows, each beside ``name`` (``targets-DEVICE.json``) as ``NAME.PART.md``."""
    from benchmarks.tables import load, write

    data, stem = load(name), str(name).removesuffix(".json")
    write(f"{stem}.summary.md", summary_table(data, name, made_by))
    write(f"{stem}.stages.md", stages_table(data))
    write(f"{stem}.critic-free.md", critic_free_table(data))
    write(f"{stem}.per-seed.md", per_seed_table(data))
    write(f"{stem}.checks.md", checks_table(data))


if __name__ == "__main__":
    sys.exit(main())
