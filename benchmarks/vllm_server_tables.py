"""The tables of benchmarks/vllm_server.py's results, rendered from the JSON as written: the speed part (seconds per
update and its phases per row, the ratios and the issue's target) and the learning part (greedy exact before and
after, every seed, and the verdicts the plan fixed)."""

from __future__ import annotations

import math

from benchmarks.tables import cell


def sig(value, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits (integers above that keep their units digit); '-' for None."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def source(data: dict, json_name: str) -> str:
    m = data.get("machine", {})
    parts = [
        m.get("cpu"),
        f"{m['cpu_count']} CPU cores" if "cpu_count" in m else None,
        f"torch {m['torch']}" if "torch" in m else None,
        f"trl {m['trl']}" if "trl" in m else None,
        f"vLLM {data['vllm']}" if data.get("vllm") else None,
    ]
    plan = data.get("plan", {})
    return (
        f"*Source: [`benchmarks/results/{json_name}`](../benchmarks/results/{json_name}), made by "
        f"`{data.get('command', 'not recorded')}` (invocation {data.get('invocation', '-')}, commit "
        f"{data.get('git_commit') or '-'}, plan `{plan.get('path', '-')}` sha256 {str(plan.get('sha256'))[:12]}); "
        f"{', '.join(p for p in parts if p) or 'machine not recorded'}.*"
    )


def _deviations(data: dict) -> str:
    found = data.get("deviations") or []
    if not found:
        return "Deviations from the plan: none."
    return "Deviations from the plan:\n\n" + "\n".join(f"- {cell(d)}" for d in found)


def _failures(data: dict) -> str:
    failed = data.get("failed") or []
    if not failed:
        return ""
    return "\n\nFailed runs:\n\n" + "\n".join(
        f"- {f.get('trainer')} {f.get('seed')}: exit {f.get('returncode')}: {cell(f.get('error', ''))}" for f in failed
    )


# ---------------------------------------------------------------------------------------- speed


def speed_table(data: dict, json_name: str) -> str:
    summary, ratios = data.get("summary", {}), data.get("ratios", [])
    repeats, timed = data.get("settings", {}).get("repeats"), data.get("settings", {}).get("timed_updates")
    lines = [
        f"Seconds per PPO update of SmolLM2-135M-Instruct with LoRA on reasoning-gym basic_arithmetic (batch 16, "
        f"64 tokens), its rollouts from a colocated vLLM engine or from a vLLM server, on-policy (s0) or one step "
        f"off-policy (s1), on the same two cores; like for like: `colocate-s0` against `colocate-s1` and `server-s0` "
        f"against `server-s1` (staleness), `colocate-sN` against `server-sN` (layout), all from one invocation "
        f"(median of {timed} timed updates x {repeats} repeats a row).",
        "",
        source(data, json_name),
        "",
        "| row | layout | trainer cores | median s/update | generate | reward | experience | update | sync | "
        "generation share | repeats' mean s/update |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, s in summary.items():
        phases = s.get("median_phases", {})
        lines.append(
            f"| `{name}` | {s['layout']} | {s['trainer_cores']} | {sig(s['median_seconds'])} | "
            f"{sig(phases.get('generate'))} | {sig(phases.get('reward'))} | {sig(phases.get('experience'))} | "
            f"{sig(phases.get('update'))} | {sig(s.get('median_sync_seconds'))} | "
            f"{sig(s.get('generation_share'), 2)} | "
            f"{', '.join(sig(v) for v in s.get('repeat_means', [])) or '-'} |"
        )
    lines += ["", "| ratio | of medians | target | meets it |", "|---|---:|---|---|"]
    for r in ratios:
        lines.append(f"| {cell(r['name'])} | {sig(r['ratio'])} | {cell(r.get('target') or '-')} | {r['verdict']} |")
    without = ", ".join(f"`{n}` {sig(s.get('median_seconds_without_last'))}" for n, s in summary.items())
    if without:
        lines += [
            "",
            "Not the plan's figure, beside it: the medians without each run's last update (at staleness 1 it rolls "
            f"nothing out for a next one): {without}.",
        ]
    idle = data.get("server", {}).get("cpu_seconds_by_row")
    if idle:
        lines += [
            "",
            "The server's own CPU seconds during each row (it idles through the colocated rows): "
            + ", ".join(f"{r['row']} (repeat {r['repeat']}) {sig(r['server_cpu_seconds'], 2)}" for r in idle)
            + ".",
        ]
    lines += ["", _deviations(data) + _failures(data)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- learning


def learning_table(data: dict, json_name: str) -> str:
    seeds = data.get("settings", {}).get("seeds", [])
    by_row: dict[str, dict[int, dict]] = {}
    for run in data.get("runs", []):
        by_row.setdefault(run["row"], {})[run["seed"]] = run
    settings = data.get("settings", {})
    evaluation, ppo = settings.get("evaluation", {}), settings.get("ppo", {})
    lines = [
        f"Greedy exact accuracy on {evaluation.get('n')} held-out doubling questions (evaluation seed "
        f"{evaluation.get('seed')}) before and after PPO ({settings.get('updates')} updates of "
        f"{ppo.get('batch_size')}), the rollouts from a colocated vLLM engine or a vLLM server, on-policy (s0) or "
        "one step off-policy (s1), paired by seed; like for like: `server-s0` against `colocate-s0` (the layout), "
        "`colocate-s1` against `colocate-s0` and `server-s1` against `server-s0` (staleness).",
        "",
        source(data, json_name),
        "",
        "| row | before | " + " | ".join(f"after, seed {s}" for s in seeds) + " | mean after | mean charset after "
        "| s/update |",
        "|---|---:|" + "---:|" * len(seeds) + "---:|---:|---:|",
    ]
    for name in data.get("rows", []):
        runs = by_row.get(name, {})
        befores = sorted({r["before"]["exact"] for r in runs.values()})
        before = (
            sig(befores[0]) if len(befores) == 1 else ("-" if not befores else f"{sig(befores[0])}-{sig(befores[-1])}")
        )
        afters = [runs[s]["after"]["exact"] for s in seeds if s in runs]
        charsets = [runs[s]["after"]["charset_acc"] for s in seeds if s in runs]
        speeds = [runs[s]["seconds_per_update"] for s in seeds if s in runs]
        lines.append(
            f"| `{name}` | {before} | "
            + " | ".join(sig(runs[s]["after"]["exact"]) if s in runs else "-" for s in seeds)
            + f" | {sig(_mean(afters))} | {sig(_mean(charsets))} | {sig(_mean(speeds))} |"
        )
    lines += [
        "",
        "| verdict | rows (a - b) | paired differences | mean | 95% interval (t) | rule | holds |",
        "|---|---|---|---:|---|---|---|",
    ]
    for v in data.get("verdicts", []):
        interval = v.get("interval")
        shown = f"[{sig(interval[0], 2)}, {sig(interval[1], 2)}] ({v['dof']} dof)" if interval else "-"
        lines.append(
            f"| {cell(v['name'])} | `{v['rows'][0]}` - `{v['rows'][1]}` | "
            f"{', '.join(f'{s}: {sig(d, 2)}' for s, d in v.get('differences', {}).items()) or '-'} | "
            f"{sig(v.get('mean'), 2)} | "
            f"{shown} | "
            f"{cell(v['rule'])} | {sig(v.get('holds')) if v.get('holds') is not None else '-'} |"
        )
    lines += ["", _deviations(data) + _failures(data)]
    return "\n".join(lines) + "\n"


def _mean(values: list) -> float | None:
    return sum(values) / len(values) if values else None
