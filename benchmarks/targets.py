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
Writes benchmarks/results/targets-<device>.json (docs/results.md is generated from it) and the tables as
targets-<device>.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = (("trl,scratch,grpo,rloo,scratch-grpo,scratch-rloo,scratch-reinforce_pp,grpo-tuned,rloo-tuned,"
         "scratch-grpo-tuned,scratch-rloo-tuned,scratch-grpo-quick,scratch-rloo-quick", "classifier"),
        ("trl,scratch", "reward_model"))
# ours and TRL's critic-free trainer given one config: the same update, so compared (speed checked, accuracy reported)
SAME_AS_TRL = {"scratch-grpo": "grpo", "scratch-rloo": "rloo", "scratch-grpo-tuned": "grpo-tuned",
               "scratch-rloo-tuned": "rloo-tuned"}
# our GRPO and RLOO at their one-step setting against TRL's GRPO and RLOO rows as TRL runs them
OURS_VS_TRLS_ROWS = {"scratch-grpo-quick": "grpo", "scratch-rloo-quick": "rloo"}
SAMPLED = {"trl": 0.98, "scratch": 0.98, "scratch-rloo-tuned": 0.98, "trl+rm": 0.99, "scratch+rm": 0.99}
COLUMNS = ("greedy_exact", "sampled_exact", "episodes_to_target", "seconds_to_target", "episodes_per_second",
           "train_seconds", "final_kl")


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
        code = cli(["compare", "--out", args.out, "--seeds", str(args.seeds), "--backends", backends,
                    "--rewards", reward, "--overwrite", *shlex.split(args.extra)])
        if code:
            return code
        results = json.loads((Path(args.out) / "results.json").read_text())
        per_seed.update(results["backends"])
        stages.update(results["stages"])
    checks, comparisons = _checks(per_seed), _same_config_comparisons(per_seed)
    info = machine()
    device = device_tag(info)
    stem = ROOT / "benchmarks" / "results" / f"targets-{device}"
    stem.with_suffix(".json").write_text(json.dumps(
        {"benchmark": "targets", "machine": info, "checks": checks,
         "same_config_comparisons": comparisons, "per_seed": per_seed,
         "stages": {k: {n: v for n, v in s.items() if n != "config"} for k, s in stages.items()}},
        indent=2) + "\n")
    stem.with_suffix(".md").write_text(_tables(per_seed, checks, comparisons))
    for c in checks:
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}  ({c['value']})")
    print("\n".join(comparisons))
    print(f"written {stem}.json and {stem}.md")
    return 0


def _checks(per_seed: dict) -> list[dict]:
    checks = []
    for label, rows in per_seed.items():
        if label not in SAMPLED or not isinstance(rows, list):
            continue
        for seed, row in enumerate(rows if "+rm" not in label else rows[:1]):
            checks.append({"check": f"{label} seed {seed}: greedy >= 0.99", "value": row["greedy_exact"],
                           "ok": row["greedy_exact"] >= 0.99})
            checks.append({"check": f"{label} seed {seed}: sampled >= {SAMPLED[label]}",
                           "value": row["sampled_exact"], "ok": row["sampled_exact"] >= SAMPLED[label]})
    if isinstance(per_seed.get("trl"), list) and isinstance(per_seed.get("scratch"), list):
        eps = {b: statistics.fmean(r["episodes_per_second"] for r in per_seed[b]) for b in ("trl", "scratch")}
        checks.append({"check": "scratch episodes/s >= 3x trl", "value": round(eps["scratch"] / eps["trl"], 2),
                       "ok": eps["scratch"] >= 3 * eps["trl"]})
        reach = {b: [r["seconds_to_target"] for r in per_seed[b]] for b in ("trl", "scratch")}
        if all(v is not None for vs in reach.values() for v in vs):
            ratio = statistics.fmean(reach["scratch"]) / statistics.fmean(reach["trl"])
            checks.append({"check": "scratch seconds to 0.99 <= 1/3 of trl", "value": round(ratio, 3),
                           "ok": ratio <= 1 / 3})
    if isinstance(per_seed.get("scratch-rloo-tuned"), list) and isinstance(per_seed.get("scratch"), list):
        wall = {b: statistics.fmean(r["train_seconds"] for r in per_seed[b]) for b in ("scratch-rloo-tuned", "scratch")}
        ratio = wall["scratch-rloo-tuned"] / wall["scratch"]
        checks.append({"check": "scratch-rloo-tuned train seconds <= 1/2 of scratch's (PPO)", "value": round(ratio, 3),
                       "ok": ratio <= 0.5})
    for ours, theirs in _pairs(per_seed, {**SAME_AS_TRL, **OURS_VS_TRLS_ROWS}):
        eps = {b: statistics.fmean(r["episodes_per_second"] for r in per_seed[b]) for b in (ours, theirs)}
        checks.append({"check": f"{ours} episodes/s >= {theirs}'s", "value": round(eps[ours] / eps[theirs], 2),
                       "ok": eps[ours] >= eps[theirs]})
    for ours, theirs in _pairs(per_seed, OURS_VS_TRLS_ROWS):  # every seed, ours against theirs
        for seed, (mine, trl) in enumerate(zip(per_seed[ours], per_seed[theirs], strict=True)):
            checks.append({"check": f"{ours} seed {seed}: greedy >= 0.99 and sampled >= {theirs}'s",
                           "value": f"{mine['greedy_exact']} / {mine['sampled_exact']} vs {trl['sampled_exact']}",
                           "ok": mine["greedy_exact"] >= 0.99 and mine["sampled_exact"] >= trl["sampled_exact"]})
    return checks


def _pairs(per_seed: dict, pairs: dict) -> list[tuple[str, str]]:
    """The pairs of rows that both ran (a row not run holds a reason, not a list of seeds)."""
    return [(ours, theirs) for ours, theirs in pairs.items()
            if isinstance(per_seed.get(ours), list) and isinstance(per_seed.get(theirs), list)]


def _same_config_comparisons(per_seed: dict) -> list[str]:
    """Per seed, which of two trainers proven to compute the same update ended ahead, and by how much; and greedy
    exact of both, which the targets ask to be >= 0.99."""
    lines = []
    for ours, theirs in _pairs(per_seed, SAME_AS_TRL):
        rows = list(zip(per_seed[ours], per_seed[theirs], strict=True))
        gaps = [mine["sampled_exact"] - trl["sampled_exact"] for mine, trl in rows]
        greedy = " / ".join(f"{mine['greedy_exact']:.3f} vs {trl['greedy_exact']:.3f}" for mine, trl in rows)
        lines.append(f"- {ours} vs {theirs} (same config), sampled exact ours - TRL's per seed: "
                     f"{' / '.join(f'{gap:+.3f}' for gap in gaps)} (ours at or ahead on "
                     f"{sum(gap >= 0 for gap in gaps)} of {len(gaps)}); greedy exact ours vs TRL's: {greedy}")
    return lines


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) and abs(value) < 10 else f"{value:,.1f}" \
        if isinstance(value, float) else f"{value:,}"


def _tables(per_seed: dict, checks: list[dict], comparisons: list[str]) -> str:
    header = "| run | seed | " + " | ".join(c.replace("_", " ") for c in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 2)]
    summary = ["| run | greedy exact, mean ± std | sampled exact, mean ± std | per seed (sampled) |", "|---|---|---|---|"]
    for label, rows in per_seed.items():
        if not isinstance(rows, list):
            lines.append(f"| {label} | - | not run: {rows.get('not_run')} |" + " |" * (len(COLUMNS) - 1))
            continue
        for seed, row in enumerate(rows):
            lines.append(f"| {label} | {seed} | " + " | ".join(_cell(row[c]) for c in COLUMNS) + " |")
        greedy, sampled = [r["greedy_exact"] for r in rows], [r["sampled_exact"] for r in rows]
        summary.append(f"| {label} | {statistics.fmean(greedy):.3f} ± {statistics.pstdev(greedy):.3f} | "
                       f"{statistics.fmean(sampled):.3f} ± {statistics.pstdev(sampled):.3f} | "
                       f"{' / '.join(f'{v:.3f}' for v in sampled)} |")
    verdicts = [f"- {'PASS' if c['ok'] else 'FAIL'} {c['check']} ({c['value']})" for c in checks]
    return "\n".join([*summary, "", *lines, "", *verdicts, "", *comparisons]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
