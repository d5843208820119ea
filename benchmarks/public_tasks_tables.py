"""The tables of benchmarks/public_tasks.py's results (benchmarks/tables.py's formats and source line): the base
panel (model x task, greedy and sampled, answers in tags), the selection's candidates, and the rows (per seed)."""

from __future__ import annotations

from benchmarks.tables import cell, fmt


def _source(data: dict, json_name: str) -> str:
    m = data.get("machine", {})
    parts = [
        f"{m['cpu_count']} CPU cores" if "cpu_count" in m else None,
        f"device {m['device']}" if "device" in m else None,
        f"torch {m['torch']}" if "torch" in m else None,
        f"trl {m['trl']}" if "trl" in m else None,
        f"Python {m['python']}" if "python" in m else None,
    ]
    machine = ", ".join(p for p in parts if p)
    return (
        f"*Source: [`benchmarks/results/{json_name}`](../benchmarks/results/{json_name}), made by "
        + "; ".join(f"`{c}`" for c in data.get("commands") or [data["command"]])
        + (f", merged by `{data['command']}`" if "invocations" in data else "")
        + f"; {machine or 'machine not recorded'}.*"
    )


def panel_table(panel: dict) -> str:
    """One line per model and task: greedy and sampled score, and how many answers carried the answer tags."""
    lines = [
        "| model | task | prompts | greedy | tagged (greedy) | sampled (T=0.7) | tagged (sampled) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for model, block in panel.items():
        for task, r in block["tasks"].items():
            g, s = r["greedy"], r["sampled"]
            lines.append(
                f"| {cell(model)} | `{task}` | {block['prompts']} | {fmt(g['score'])} | "
                f"{g['tagged']}/{g['answers']} | {fmt(s['score'])} | {s['tagged']}/{s['answers']} |"
            )
    return "\n".join(lines)


def candidates_table(candidates: list[dict]) -> str:
    """One line per candidate; ``answer read`` counts the replies the format found an answer in (tags, or a number)."""
    lines = [
        "| task | answer format | system prompt | difficulty | tokens | sampled | answer read |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for c in candidates:
        s = c["sampled"]
        lines.append(
            f"| `{c['task']}` | {c.get('answer_format', 'tags')} | {c['system_prompt']} | {c['difficulty']} | "
            f"{s['max_new_tokens']} | {fmt(s['score'])} | {s['tagged']}/{s['answers']} |"
        )
    return "\n".join(lines)


def summary_table(rows: list[dict]) -> str:
    """One line per task and trainer: the means over seeds of the sampled test score before and after, how many seeds
    gained at least 0.2 (issue 52's target) and how many ended above TRL's GRPO at the same seed, seconds per update."""
    lines = [
        "| task | trainer | seeds | before | after | gain | seeds +0.2 | seeds above trl-grpo | greedy after "
        "| s/update |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    trl = {(r["task"], r["seed"]): r["after"] for r in rows if r["trainer"] == "trl-grpo"}
    for task in dict.fromkeys(r["task"] for r in rows):
        for trainer in dict.fromkeys(r["trainer"] for r in rows):
            group = [r for r in rows if r["task"] == task and r["trainer"] == trainer and r.get("after") is not None]
            if not group:
                continue
            n = len(group)
            gains = [round(r["after"] - r["before"], 4) for r in group]  # 0.5 - 0.3 is 0.2, not 0.1999...
            paired = [r for r in group if (task, r["seed"]) in trl]
            above = (
                "-"
                if trainer == "trl-grpo" or not paired  # no TRL row at these seeds: nothing to compare with
                else f"{sum(r['after'] > trl[(task, r['seed'])] for r in paired)} of {len(paired)}"
            )
            lines.append(
                f"| `{task}` | {trainer} | {','.join(str(r['seed']) for r in group)} | "
                f"{fmt(sum(r['before'] for r in group) / n)} | {fmt(sum(r['after'] for r in group) / n)} | "
                f"{fmt(sum(gains) / n)} | {sum(g >= 0.2 for g in gains)} of {n} | {above} | "
                f"{fmt(sum(r['after_greedy'] for r in group) / n)} | "
                f"{fmt(sum(r['seconds_per_update'] for r in group) / n, 1)} |"
            )
    return "\n".join(lines)


def critic_targets(rows: list[dict]) -> list[str]:
    """Issue 51's judgement on the public tasks (critic_ablation_plan.md, amendment 9), where its candidate ran:
    each PPO row against the better GRPO row over every task and seed, then task by task."""
    from benchmarks.critic_verdicts import judgement_lines

    trainers = {r["trainer"] for r in rows}
    if "ppo-combination" not in trainers:
        return []
    groups = [g for g in ("grpo", "trl-grpo") if g in trainers]
    trl = "trl-grpo" if "trl-grpo" in trainers else None
    ppo = [p for p in ("ppo", "ppo-combination") if p in trainers]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    parts = []
    for label, subset in [("every task", rows)] + [(f"`{t}`", [r for r in rows if r["task"] == t]) for t in tasks]:
        cost = "grpo" if subset is rows and "grpo" in trainers else None  # seconds once, over every task
        lines = [line for p in ppo for line in judgement_lines(subset, p, groups, (2, 3), trl, cost)]
        if lines:
            parts.append("\n".join([f"| target (issue 51), {label} | measured | met |", "|---|---|---|", *lines]))
    return parts


def rows_table(rows: list[dict]) -> str:
    """One line per row (seed by seed): before and after on the test stream, seconds per update, peak RSS."""
    lines = [
        "| model | task | trainer | seed | updates | before | after | gain | s/update | peak RSS MiB | invocation |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        gain = r["after"] - r["before"] if r.get("after") is not None and r.get("before") is not None else None
        lines.append(
            f"| {cell(r['model'])} | `{r['task']}` | {r['trainer']} | {r['seed']} | {r['updates']} | "
            f"{fmt(r.get('before'))} | {fmt(r.get('after'))} | {fmt(gain)} | "
            f"{fmt(r['seconds_per_update'], 1)} | {fmt(r['peak_rss_mib'], 0)} | {r['invocation']} |"
        )
    return "\n".join(lines)


def leak_line(rows: list[dict]) -> str:
    """The test prompts a row also trained on (``test_overlap``, 0 by construction) and each task's setting's
    distinct questions, as the rows recorded them."""
    distinct = {r["task"]: r["distinct_questions"] for r in rows}
    most = max(r["test_overlap"] for r in rows)
    return (
        "Test prompts among a row's training prompts (`test_overlap`): "
        + ("0 in every row" if most == 0 else f"up to {most}")
        + ". Distinct questions a task's setting makes (estimated): "
        + ", ".join(f"`{task}` {fmt(n, 0)}" for task, n in distinct.items())
        + "."
    )


def results_table(data: dict, json_name: str) -> str:
    parts = [_source(data, json_name)]
    if data.get("base_panel"):
        parts.append(panel_table(data["base_panel"]))
        seconds = ", ".join(f"{m} {fmt(b['seconds'], 0)} s" for m, b in data["base_panel"].items())
        parts.append(
            f"Test stream (seed 0), reasoning-gym's default system prompt, up to "
            f"{next(iter(data['base_panel'].values()))['max_new_tokens']} new tokens; scored by "
            f"`ReasoningGymReward`. Seconds a panel: {seconds}. SmolLM2's tasks with a sampled score in "
            f"[0.05, 0.6]: {', '.join(f'`{t}`' for t in data.get('qualifying', [])) or 'none'}."
        )
    if data.get("candidates"):
        parts.append(candidates_table(data["candidates"]))
        section = "2b" if data["candidates"][0].get("answer_format") == "last-number" else "2"
        parts.append(
            f"Chosen (the plan's section {section}): "
            + (
                ", ".join(
                    f"`{c['task']}` ({c.get('answer_format', 'tags')}, {c['system_prompt']}, {c['difficulty']}, "
                    f"{fmt(c['sampled']['score'])}"
                    f"{'' if c.get('qualifies') else ', outside [0.05, 0.6]'})"
                    for c in data.get("chosen", [])
                )
                or "none"
            )
            + "."
        )
    if data.get("rows") and data.get("mode") == "train":
        parts.append(summary_table(data["rows"]))
        s = data["rows"][0]["settings"]
        parts.append(
            f"Means over seeds; before and after: the sampled (T={s['temperature']}) score on the first "
            f"{data['rows'][0]['eval_prompts']} prompts of the task's test stream, replies up to "
            f"{s['response_length']} tokens; {data['rows'][0]['updates']} updates of {s['batch_size']} rollouts; "
            "every row, seed by seed, below."
        )
    if data.get("rows") and data.get("mode") == "train":
        parts += critic_targets(data["rows"])
    if data.get("rows") and all("test_overlap" in r for r in data["rows"]):  # rows made before issue 80 lack it
        parts.append(leak_line(data["rows"]))
    if data.get("rows"):
        parts.append(rows_table(data["rows"]))
    if data.get("mode") == "cost" and len(data.get("rows", [])) >= 2:
        first, *others = data["rows"]
        s = first["settings"]
        parts.append(
            f"Same shapes for each model: {s['batch_size']} rollouts an update, responses up to "
            f"{s['response_length']} tokens, LoRA r={s['lora']['r']}, trl-ext PPO, one process after the "
            "other. Against "
            + cell(first["model"])
            + ": "
            + "; ".join(
                f"{cell(r['model'])} {fmt(r['seconds_per_update'] / first['seconds_per_update'], 2)}x the "
                f"seconds an update, {fmt(r['peak_rss_mib'] / first['peak_rss_mib'], 2)}x the peak RSS"
                for r in others
            )
            + "."
        )
    if data.get("not_run"):
        parts.append(
            "Not run: "
            + ", ".join(f"{r['trainer']} `{r['task']}` seed {r['seed']}" for r in data["not_run"])
            + f" ({data['not_run'][0]['reason']})."
        )
    if data.get("reruns"):
        parts.append(
            "Run again in a later invocation: "
            + "; ".join(f"{f['trainer']} {f['task']} seed {f['seed']}: {cell(f['error'])}" for f in data["reruns"])
        )
    if data.get("failed"):
        parts.append(
            "Failed: "
            + "; ".join(f"{f['trainer']} {f['task']} seed {f['seed']}: {cell(f['error'])}" for f in data["failed"])
        )
    return "\n\n".join(parts)
