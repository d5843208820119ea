"""The real-model benchmark's tables (benchmarks/real_model.py writes its own with ``results_table``), and the
comparisons docs/results.md makes of its runs: a setting's effect on one seed's run (whitened advantages), on every
seed (advantages divided by the group's std), and the GPU run's columns.

    python benchmarks/real_model_tables.py     # rewrite the comparison tables from benchmarks/results/
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN = "real-model-cpu.json"
# How the files made by several invocations were made: their JSON holds one invocation's command.
MADE_BY = {
    MAIN: "sixteen row files gathered with `--collect` (the file's `command`), from these runs of "
    "`OMP_NUM_THREADS=1 python benchmarks/real_model.py`: TRL's rows at commits 7922095 (`--seeds 0,1` for all "
    "four rows) and 6d38256 (`--rows scratch-ppo,trl-ppo --seeds 2,3`; their code has not changed since) and "
    "`--rows trl-grpo --seeds 2` and `--seeds 3`; the scratch rows at commit feedc1c, `--rows scratch-ppo "
    "--eval-every 4` with `--seeds 0 --jobs 1`, `--seeds 1,2` and `--seeds 3 --jobs 1`; trl-ext's GRPO rows at "
    "commit c489beb, `--rows scratch-grpo --seeds 0,1,2,3 --set 'scale_rewards=\"none\"'` (the row's own "
    "setting since); two rows ran at a time on the 2 cores",
    "real-model-cpu-whitened-seed0.json": "`OMP_NUM_THREADS=1 python benchmarks/real_model.py --rows scratch-ppo "
    "--seeds 0 --jobs 1 --eval-every 4 --set whiten_advantages=true --out "
    "benchmarks/results/real-model-cpu-whitened-seed0`, side by side with the "
    "same command without `--set` (the seed-0 row of `real-model-cpu.json`)",
    "real-model-cpu-grpo-std-scaled.json": "four row files gathered with `--collect` (the file's `command`) from "
    "`OMP_NUM_THREADS=1 python benchmarks/real_model.py --rows scratch-grpo` "
    "at commit feedc1c (then the row's settings were `kl_coef=0` alone): "
    "`--seeds 0,1` and `--seeds 2,3 --jobs 1`; the same rows now come from "
    "`--rows scratch-grpo --set 'scale_rewards=\"group\"'`",
    "critic-number-judge-cpu.json": "two invocations of `OMP_NUM_THREADS=1 python benchmarks/real_model.py --plan "
    "benchmarks/plans/critic-number-judge.json`, all five rows in each (plan amendment 5): seeds 30-34 at commit "
    "34635f3 (`--out benchmarks/results/critic-number-judge-cpu-seeds30-34`, which stopped before seed 35) and seed "
    "35 at commit 52c52c9 (`--seeds 35 --out benchmarks/results/critic-number-judge-cpu-seed35`); their 30 rows "
    "gathered with `--collect` (the file's `command`: row files written from those two files' `rows`), each keeping "
    "its invocation",
    "critic-number-judge-cpu-seeds30-34.json": "`OMP_NUM_THREADS=1 python benchmarks/real_model.py --plan "
    "benchmarks/plans/critic-number-judge.json --out benchmarks/results/critic-number-judge-cpu` at commit 34635f3 "
    "(the file renamed when seed 35's invocation joined it in `critic-number-judge-cpu.json`)",
    "real-model-fair-gpu-h100.json": "`bash benchmarks/gpu_run.sh --real-model "
    "benchmarks/plans/real-model-fair-gpu.json "
    "--out $OUT/real-model-fair-gpu-h100` at commit a4efc94 on a lent H100 (after "
    "`gpu_run.sh --install`, which carried the wheels and the first part of the "
    "SmolLM2 wheel), one invocation (the JSON's `commit` reads the device copy's git base, "
    "0b1d8e3, plus the working tree's changes: a4efc94's tree)",
}


def _source(data: dict, name: str, made_by: str | None = None) -> str:
    m = data["machine"]
    made_by = made_by or MADE_BY.get(name) or f"`{data['command']}`"
    return (
        f"*Source: [`benchmarks/results/{name}`](../benchmarks/results/{name}), made by {made_by} on "
        f"{m['cpu']} ({m['cores']} cores), one torch thread a row.*"
    )


def _ok(value: bool) -> str:
    return "yes" if value else "no"


def _targets(data: dict) -> list[str]:
    """What the scratch rows must reach against TRL's on the same seeds: the benchmark's targets."""
    by = {(r["trainer"], r["seed"]): r for r in data["rows"]}
    checks = []
    for seed in data["seeds"]:
        ours, theirs = by.get(("scratch-ppo", seed)), by.get(("trl-ppo", seed))
        if ours:
            checks.append(
                f"| seed {seed}: trl-ext PPO gains >= 0.4 (sampled) | {ours['after'] - ours['before']:+.3f} "
                f"| {_ok(ours['after'] - ours['before'] >= 0.4)} |"
            )
        if ours and theirs:
            checks.append(
                f"| seed {seed}: trl-ext PPO held-out >= TRL 1.12 PPO's | {ours['after']:.3f} vs "
                f"{theirs['after']:.3f} | {_ok(ours['after'] >= theirs['after'])} |"
            )
            ratio = ours["seconds_per_update"] / theirs["seconds_per_update"]
            checks.append(f"| seed {seed}: trl-ext PPO s/update <= 0.7x TRL's | {ratio:.2f}x | {_ok(ratio <= 0.7)} |")
        free = [by[(n, seed)] for n in ("scratch-grpo", "scratch-rloo") if (n, seed) in by]
        if free and ("trl-grpo", seed) in by:
            grpo = by[("trl-grpo", seed)]
            checks.append(
                f"| seed {seed}: trl-ext {free[0]['trainer']} >= TRL GRPO | {free[0]['after']:.3f} vs "
                f"{grpo['after']:.3f} | {_ok(free[0]['after'] >= grpo['after'])} |"
            )
    for ours_name, theirs_name in (("scratch-ppo", "trl-ppo"), ("scratch-grpo", "trl-grpo")):
        pairs = [
            (by[(ours_name, s)], by[(theirs_name, s)])
            for s in data["seeds"]
            if (ours_name, s) in by and (theirs_name, s) in by
        ]
        if pairs:
            ours_mean, theirs_mean = (sum(p[i]["after"] for p in pairs) / len(pairs) for i in (0, 1))
            checks.append(
                f"| mean of {len(pairs)} seeds: {ours_name} held-out >= {theirs_name}'s | {ours_mean:.3f} vs "
                f"{theirs_mean:.3f} | {_ok(ours_mean >= theirs_mean)} |"
            )
    return checks


def _kl(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _description(data: dict) -> str:
    """What the rows ran with: the settings they share, or (a plan's run) where each row's full settings are."""
    st, split = data["settings"], data.get("split", "heldout").replace("heldout", "held-out")
    if "plan" in data:
        ran = {(r["trainer"], r["seed"]) for r in [*data["rows"], *data.get("failed", [])]}
        missing = [f"{t} seed {s}" for s in data["seeds"] for t in data["plan"]["rows"] if (t, s) not in ran]
        return (
            f"The plan `{data['plan']['path']}`: {data['updates']} updates a row, {data['held_out_prompts']} "
            f"{split} prompts, rows {st['jobs']} side by side. Each row's full settings are in the JSON; the "
            "pairs' computed differences are below. Score: `JustTheNumber` (greedy in brackets)."
            + (
                f" **Stopped early**: {len(missing)} planned rows did not run ({', '.join(missing)})."
                if missing
                else ""
            )
        )
    return (
        f"{data['model']}; LoRA r={st['lora_r']} (alpha {st['lora_alpha']}, {st['lora_target_modules']}); "
        f"{st['batch_size']} rollouts an update, {st['num_ppo_epochs']} epochs, lr {st['learning_rate']} "
        f"({st['lr_scheduler_type']}), T={st['temperature']}, answers up to {st['response_length']} tokens, "
        f"{data['updates']} updates; {data['held_out_prompts']} {split} prompts. Score: `JustTheNumber`, "
        f"sampled at T={st['temperature']} (greedy in brackets). Rows ran {st['jobs']} side by side."
        + "".join(
            f" {trainer}: {', '.join(f'{k}={v}' for k, v in changed.items())}."
            for trainer, changed in data.get("row_settings", {}).items()
            if changed
        )
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def pair_lines(data: dict) -> list[str]:
    """A plan's pairs: each side's mean score over the seeds both ran, how many seeds trl-ext's row held TRL's,
    the settings keys in which the rows differ (computed, and declared by the plan) and the time ratio per
    invocation (never across invocations)."""
    by = {(r["trainer"], r["seed"]): r for r in data["rows"]}
    lines = [
        "| rows | kind | seeds | mean score, sampled (greedy) | seeds the first >= the second | settings that differ "
        "(computed) | declared | seconds per update, ratio per invocation |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in data["comparisons"]:
        a, b = c["rows"]
        pairs = [(by[(a, s)], by[(b, s)]) for s in c["seeds"]]
        if pairs:
            means = " vs ".join(
                f"{_mean([p[i]['after'] for p in pairs]):.3f} ({_mean([p[i]['after_greedy'] for p in pairs]):.3f})"
                for i in (0, 1)
            )
            held = f"{sum(x['after'] >= y['after'] for x, y in pairs)} of {len(pairs)}"
        else:
            means, held = "-", "-"
        differ = ", ".join(f"{k} ({va} / {vb})" for k, (va, vb) in c["differing_settings"].items()) or (
            "none" if c["seeds"] else "- (not both measured)"
        )
        ratios = (
            "; ".join(
                f"{i['invocation']}: {i['seconds_per_update'][a]} / {i['seconds_per_update'][b]} = {i['ratio']}x"
                for i in c["invocations"]
            )
            or "-"
        )
        lines.append(
            f"| {a} vs {b} | {c['kind']} | {','.join(map(str, c['seeds'])) or '-'} | {means} | {held} "
            f"| {differ} | {', '.join(c['declared']) or 'none'} | {ratios} |"
        )
    return lines


def plan_targets(data: dict) -> list[str]:
    """Issue 40's targets on a plan's pairs: trl-ext's PPO at least TRL's on the mean and on 5 of every 6 seeds, at
    most 0.7x its seconds per update in every invocation; trl-ext's GRPO at least TRL's on the mean; every PPO row's
    update-1 KL within 0.1 nats of zero (the policy starts equal to its reference)."""
    by = {(r["trainer"], r["seed"]): r for r in data["rows"]}
    checks = []
    for c in (c for c in data["comparisons"] if c["kind"] == "pair" and c["seeds"]):
        a, b = c["rows"]
        pairs = [(by[(a, s)], by[(b, s)]) for s in c["seeds"]]
        ours, theirs = (_mean([p[i]["after"] for p in pairs]) for i in (0, 1))
        checks.append(f"| {a} >= {b} on the mean | {ours:.3f} vs {theirs:.3f} | {_ok(ours >= theirs)} |")
        if pairs[0][0].get("kind", a).endswith("ppo"):
            held, need = sum(x["after"] >= y["after"] for x, y in pairs), -(-5 * len(pairs) // 6)
            checks.append(
                f"| {a} >= {b} on at least {need} of {len(pairs)} seeds | {held} of {len(pairs)} | "
                f"{_ok(held >= need)} |"
            )
            for i in c["invocations"]:
                checks.append(
                    f"| {a} s/update <= 0.7x {b}'s, invocation {i['invocation']} | {i['ratio']:.2f}x | "
                    f"{_ok(i['ratio'] <= 0.7)} |"
                )
    kl = [r for r in data["rows"] if r.get("update1_kl") is not None and "ppo" in r.get("kind", r["trainer"])]
    if kl:
        worst = max(kl, key=lambda r: abs(r["update1_kl"]))
        checks.append(
            f"| every PPO row's update-1 KL within 0.1 of 0 ({len(kl)} rows) | largest "
            f"{worst['update1_kl']:+.3f} ({worst['trainer']}, seed {worst['seed']}) | "
            f"{_ok(abs(worst['update1_kl']) <= 0.1)} |"
        )
    return checks


def selection_targets(data: dict) -> list[str]:
    """A selection plan's verdicts (a plan named ``*-select``): each extra against the row it is compared with by
    issue 51's rule (``critic_verdicts.selection_line``); the pair (the critic against GRPO) on the mean and seed by
    seed, and its cost per invocation."""
    from benchmarks.critic_verdicts import COST_LIMIT, at_least, ok, selection_line

    by = {(r["trainer"], r["seed"]): r for r in data["rows"]}
    checks = []
    for c in (c for c in data["comparisons"] if c["seeds"]):
        a, b = c["rows"]
        if c["kind"] == "extra":
            checks.append(selection_line(data["rows"], a, b))
            continue
        pairs = [(by[(a, s)], by[(b, s)]) for s in c["seeds"]]
        ours, theirs = (_mean([p[i]["after"] for p in pairs]) for i in (0, 1))
        held, need = sum(x["after"] >= y["after"] for x, y in pairs), at_least((2, 3), len(pairs))
        checks.append(f"| {a} >= {b} on the mean | {ours:.3f} vs {theirs:.3f} | {ok(ours >= theirs)} |")
        checks.append(f"| {a} >= {b} on at least {need} of {len(pairs)} seeds | {held} | {ok(held >= need)} |")
        for i in c["invocations"]:
            checks.append(
                f"| {a} s/update <= {COST_LIMIT}x {b}'s, invocation {i['invocation']} | {i['ratio']:.2f}x | "
                f"{ok(i['ratio'] <= COST_LIMIT)} |"
            )
    return checks


def judgement_targets(data: dict) -> list[str]:
    """Issue 51's targets on a fresh-ground plan (a plan named ``*-judge``): each of trl-ext's PPO rows against the
    better GRPO row (trl-ext's or TRL's) on the mean and ahead of it on at least 2 of every 3 seeds (4 of 6), and
    its seconds an update at most 1.25x trl-ext GRPO's in each invocation (``critic_verdicts.judgement_lines``)."""
    from benchmarks.critic_verdicts import BETTER, judgement_lines

    kinds = {r["trainer"]: r.get("kind", r["trainer"]) for r in data["rows"]}
    groups = [t for t, k in kinds.items() if k in ("scratch-grpo", "trl-grpo")]
    ours = next((t for t in groups if kinds[t] == "scratch-grpo"), None)
    if not groups:
        return []
    return [
        line
        for ppo in (t for t, k in kinds.items() if k == "scratch-ppo")
        for line in judgement_lines(data["rows"], ppo, groups, (2, 3), BETTER, ours)
    ]


def results_table(data: dict, name: str, made_by: str | None = None) -> str:
    """A results file's table: every row's held-out score before and after, speed and memory; the targets (a
    plan's run: its pairs first, then issue 40's targets on them, or a selection plan's rule)."""
    from benchmarks.critic_health_table import health_table

    lines = [_source(data, name, made_by), "", _description(data), ""]
    if "comparisons" in data:
        plan = data["plan"]["name"]
        verdicts = (
            selection_targets(data)
            if plan.endswith("-select")
            else judgement_targets(data)
            if plan.endswith("-judge")
            else plan_targets(data)
        )
        lines += [*pair_lines(data), "", "| target | measured | met |", "|---|---|---|", *verdicts, ""]
    lines += health_table(data)
    lines += [
        "| trainer | seed | episodes | before | after | gain | s/update | update phases (s) | update-1 KL | "
        "peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        phases = ", ".join(f"{k.split('/')[1]} {v:.1f}" for k, v in r.get("seconds_per_update_by_phase", {}).items())
        lines.append(
            f"| {r['trainer']} | {r['seed']} | {r['episodes']} | {r['before']:.3f} ({r['before_greedy']:.3f})"
            f" | {r['after']:.3f} ({r['after_greedy']:.3f}) | {r['after'] - r['before']:+.3f} | "
            f"{r['seconds_per_update']:.1f} | {phases or '-'} | {_kl(r.get('update1_kl'))} | "
            f"{r['peak_rss_mib']:,.0f} |"
        )
    for f in data.get("failed", []):
        error = " ".join(str(f["error"]).split()).replace("|", "\\|")
        lines.append(f"| {f['trainer']} | {f['seed']} | failed (exit {f['returncode']}): {error} | | | | | | | |")
    if "comparisons" not in data:
        lines += ["", "| target | measured | met |", "|---|---|---|", *_targets(data)]
    lines += [
        "",
        f"![reward per update and against seconds, every row and seed](../benchmarks/results/"
        f"{name.removesuffix('.json')}.png)",
    ]
    return "\n".join(lines)


def whitening_table(data: dict, main: dict, name: str) -> str:
    """One seed with whitened advantages beside the main run's row of that seed: reward, approx-KL and held-out
    along the run."""
    whitened = data["rows"][0]
    plain = next(r for r in main["rows"] if r["trainer"] == "scratch-ppo" and r["seed"] == whitened["seed"])
    lines = [
        _source(data, name),
        "",
        f"Seed {whitened['seed']}, the same settings but `whiten_advantages`; beside it the row of `{MAIN}`. "
        "Held-out: sampled score of the 200 held-out prompts after the update; approx-KL: PPO's mean estimate of "
        "how far an update moved the policy on its own rollouts.",
        "",
        "| update | " + " | ".join(str(c["update"]) for c in plain["curve"]) + " |",
        "|---" * (len(plain["curve"]) + 1) + "|",
    ]
    for label, row in (("whitened", whitened), ("not whitened", plain)):
        held = {c["update"]: c["held_out"] for c in row["curve"] if "held_out" in c}
        held[row["curve"][-1]["update"]] = row["after"]
        lines.append(f"| reward, {label} | " + " | ".join(f"{c['reward']:.2f}" for c in row["curve"]) + " |")
        lines.append(
            f"| approx-KL, {label} | "
            + " | ".join(f"{c.get('approxkl', float('nan')):.3f}" for c in row["curve"])
            + " |"
        )
        lines.append(
            f"| held-out, {label} | "
            + " | ".join(f"**{held[c['update']]:.3f}**" if c["update"] in held else "" for c in row["curve"])
            + " |"
        )
    return "\n".join(lines)


def group_scaling_table(data: dict, main: dict, name: str) -> str:
    """trl-ext's GRPO rows with advantages divided by the group's std beside the main run's (not divided) and
    TRL's GRPO, every seed."""
    scaled = {r["seed"]: r for r in data["rows"]}
    unscaled = {r["seed"]: r for r in main["rows"] if r["trainer"] == "scratch-grpo"}
    trl = {r["seed"]: r for r in main["rows"] if r["trainer"] == "trl-grpo"}
    lines = [
        _source(data, name),
        "",
        "Held-out score after 320 episodes (sampled, greedy in brackets). The std-scaled rows are the computation "
        "TRL's GRPOTrainer makes per update (`tests/test_trl_group_equality.py`); the unscaled ones are the "
        f"`scratch-grpo` rows of `{MAIN}`.",
        "",
        "| seed | trl-ext GRPO, advantages / group std (`scale_rewards=group`) | trl-ext GRPO, not scaled "
        "(`scale_rewards=none`) | TRL GRPO (`scale_rewards=group`) |",
        "|---|---|---|---|",
    ]
    cell = lambda r: f"{r['after']:.3f} ({r['after_greedy']:.3f})" if r else "-"  # noqa: E731
    for seed in sorted(set(scaled) | set(unscaled) | set(trl)):
        lines.append(f"| {seed} | {cell(scaled.get(seed))} | {cell(unscaled.get(seed))} | {cell(trl.get(seed))} |")
    means = [sum(r["after"] for r in d.values()) / len(d) for d in (scaled, unscaled, trl)]
    lines.append("| mean | " + " | ".join(f"{m:.3f}" for m in means) + " |")
    return "\n".join(lines)


def _column(run: dict, trainer: str) -> str:
    """A column of the GPU table: the trainer and the settings its invocation changed (``--set``)."""
    words = run["command"].split()
    changed = [after for before, after in zip(words, words[1:]) if before == "--set"]
    changed += [run["column_notes"][trainer]] if trainer in run.get("column_notes", {}) else []
    return trainer + (f" ({', '.join(c.replace(chr(34), '') for c in changed)})" if changed else "")


def gpu_table(data: dict, name: str) -> str:
    """The GPU invocations' rows, a column each (trainer and changed settings), every seed."""
    first = data["runs"][0]["rows"][0]
    columns: dict[str, dict[int, dict]] = {}
    for run in data["runs"]:
        for r in run["rows"]:
            columns.setdefault(_column(run, r["trainer"]), {})[r["seed"]] = r
    seeds = sorted({seed for col in columns.values() for seed in col})
    commands = "; ".join(f"`{run['command']}` ({run['wall_seconds']:.0f} s)" for run in data["runs"])
    lines = [
        f"*Source: [`benchmarks/results/{name}`](../benchmarks/results/{name}), made by {commands} on "
        f"{data['device']} with {data['runs'][0]['machine']['cores']} CPU cores, torch {first['torch']}, every "
        f"row a process with one torch thread, the rows of an invocation side by side on the one GPU. {data['how']}*",
        "",
        "Held-out score after training (sampled at T=0.7, greedy in brackets), every seed; the settings are "
        "the CPU run's except what a column names. Before training: "
        + ", ".join(f"seed {s} {next(c[s]['before'] for c in columns.values() if s in c):.3f}" for s in seeds)
        + ".",
        "",
        "| seed | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for seed in seeds:
        cells = [
            f"{c[seed]['after']:.3f} ({c[seed]['after_greedy']:.3f})" if seed in c else "-" for c in columns.values()
        ]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    mean = [sum(r["after"] for r in c.values()) / len(c) for c in columns.values()]
    lines.append("| mean | " + " | ".join(f"{m:.3f}" for m in mean) + " |")
    lines.append(
        "| s/update, mean | "
        + " | ".join(f"{sum(r['seconds_per_update'] for r in c.values()) / len(c):.2f}" for c in columns.values())
        + " |"
    )
    lines.append(
        "| peak GPU MiB | "
        + " | ".join(f"{max(r['peak_gpu_mib'] for r in c.values()):,.0f}" for c in columns.values())
        + " |"
    )
    return "\n".join(lines)


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from benchmarks.tables import load, write

    main_data = load(MAIN)
    write("real-model-cpu.md", results_table(main_data, MAIN))
    write(
        "real-model-cpu-whitened-seed0.md",
        whitening_table(load("real-model-cpu-whitened-seed0.json"), main_data, "real-model-cpu-whitened-seed0.json"),
    )
    write(
        "real-model-cpu-grpo-std-scaled.md",
        group_scaling_table(
            load("real-model-cpu-grpo-std-scaled.json"), main_data, "real-model-cpu-grpo-std-scaled.json"
        ),
    )
    write("real-model-gpu-h100.md", gpu_table(load("real-model-gpu-h100.json"), "real-model-gpu-h100.json"))
    results = ROOT / "benchmarks" / "results"
    for plan_run in sorted([*results.glob("real-model-fair*.json"), *results.glob("critic-number-*.json")]):
        write(plan_run.with_suffix(".md").name, results_table(load(plan_run.name), plan_run.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
