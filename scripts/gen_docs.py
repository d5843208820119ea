"""Write the two generated pages of docs/: the command reference and the results.

    python scripts/gen_docs.py            # rewrite docs/commands.md and docs/results.md's generated blocks
    python scripts/gen_docs.py --check    # change nothing; exit 3 naming each page that is not what this writes

docs/commands.md is generated whole, from the commands' option dataclasses: every ``trl-ext`` subcommand
(``trl_ext.commands.cli.commands``), its parts (one option dataclass per concern, as
``trl_ext.commands.parsing.Command`` combines them), each field's flag, type, default and help
(``trl_ext.settings.fields.field(help=...)``) and choices, and the defaults a command sets over a dataclass's own.

docs/results.md is written by hand, except its generated blocks, each between
``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated: NAME -->``: tables from
``benchmarks/results/*.json``, each with the command that wrote the file and the machine it ran on; a block named
after a results file whose benchmark writes its own table (``NAME.md`` beside ``NAME.json``) shows that table. A JSON
file that no block renders gets a plain listing in the ``other-results`` block, so no result is left out.

tests/test_docs.py runs ``--check`` in a fresh interpreter: a new option, a changed help text or a new
benchmark result fails the suite until this script is run again and its output committed.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import statistics
import sys
import typing
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
COMMANDS_PAGE = DOCS / "commands.md"
RESULTS_PAGE = DOCS / "results.md"
REGENERATE = "python scripts/gen_docs.py"
STALE = 3  # --check's exit code for pages out of date (a crash exits 1)


# ---------------------------------------------------------------------------------------------- commands.md


def _value(value) -> str:
    """A default as a user writes it on the command line or in YAML."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return re.sub(r"e([-+])0(\d)", r"e\1\2", repr(value))  # 1e-05 as 1e-5
    return str(value)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _optional(cls, name: str) -> bool:
    hint = typing.get_type_hints(cls)[name]
    return type(None) in typing.get_args(hint)


def _dataclass_default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _doc(cls) -> str:
    """A dataclass's own docstring (not the signature dataclasses writes when there is none), first paragraph."""
    doc = (cls.__doc__ or "").strip()
    if not doc or doc.startswith(cls.__name__ + "("):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def _source(cls) -> str:
    return cls.__module__.replace(".", "/") + ".py"


def _anchor(text: str) -> str:
    """GitHub's heading anchor."""
    return re.sub(r"[^a-z0-9 _-]", "", text.lower()).replace(" ", "-")


def _shared_heading(cls) -> str:
    return f"{cls.__name__}"


def _option_rows(cls, command=None, fields=None) -> list[str]:
    """A table of a part's options: flag, type, default (the command's where it sets one), help and choices."""
    from trl_ext.settings.fields import cli_fields

    hints = {name: tp for name, (_, _, tp) in fields.items()} if fields else None
    rows = ["| option | type | default | what it does |", "|---|---|---|---|"]
    for f in cli_fields(cls):
        flag = "--" + f.name.replace("_", "-")
        tp = hints[f.name] if hints else None
        if tp is None:
            from trl_ext.commands.parsing import _arg_type

            tp = _arg_type(typing.get_type_hints(cls)[f.name])
        type_text = _type_name(tp) + (" or none" if _optional(cls, f.name) else "")
        default = _dataclass_default(f)
        if command is not None and f.name in command.defaults:
            default_text = f"**{_value(command.defaults[f.name])}**"
            if default is not dataclasses.MISSING and default != command.defaults[f.name]:
                default_text += f" ({cls.__name__}: {_value(default)})"
        elif default is dataclasses.MISSING:
            default_text = "required"
        else:
            default_text = _value(default)
        help_text = f.metadata.get("help", "")
        choices = f.metadata.get("choices")
        if choices is not None:
            help_text = help_text.rstrip()
            help_text += ("" if not help_text or help_text.endswith(".") else ".") + (" " if help_text else "") + "Choices: " + ", ".join(f"`{c}`" for c in choices) + (", or your own as `module:name`" if isinstance(choices, Mapping) else "") + "."
        rows.append(f"| `{flag}` | {type_text} | {_cell(default_text)} | {_cell(help_text)} |")
    return rows


def commands_page() -> str:
    sys.path.insert(0, str(ROOT))
    from trl_ext.commands.cli import commands

    table = commands()
    users: dict[type, list[str]] = {}
    for name, command in table.items():
        for cls in command.parts.values():
            users.setdefault(cls, []).append(name)
    shared = [cls for cls, names in users.items() if len(names) > 1]

    lines = [
        "# Commands and options",
        "",
        f"<!-- Generated by `{REGENERATE}` from the option dataclasses' field help: do not edit by hand. -->",
        "",
        "Generated from the code: every `trl-ext` subcommand, the option dataclasses it combines (one per concern, "
        "as TRL's `TrlParser` combines its own), and each option's type, default and help as its field declares "
        f"them. `{REGENERATE}` rewrites this page; `tests/test_docs.py` fails while it is out of date.",
        "",
        "How options are read (`trl_ext/commands/parsing.py`): every option is a flag (`--learning-rate 1e-3`) and a "
        "key of the same name in a YAML file given with `--config FILE.yaml` (`learning_rate: 1e-3`); flags "
        "override the file, the file overrides the defaults. Flags are never abbreviated (`--step` is an error, not "
        "`--steps`). A boolean flag alone means true (`--fresh`), or takes a value (`--separate-critic false`). "
        "A **bold** default is the command's own, set over the dataclass's (shown after it). An unknown YAML key, a "
        "value of the wrong type, a missing required option or a bad value: one `trl-ext: error: ...` line, exit "
        "code 2 ([errors.md](errors.md)).",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for name, command in table.items():
        lines.append(f"| [`trl-ext {name}`](#{_anchor('trl-ext ' + name)}) | {_cell(command.help)} |")
    for name, command in table.items():
        fields = command.fields()
        lines += ["", f"## trl-ext {name}", "", _cell(command.help[:1].upper() + command.help[1:]) + ".", ""]
        lines.append(f"`trl-ext {name} --config FILE.yaml` reads any of the options below from a YAML file.")
        for part, cls in command.parts.items():
            lines.append("")
            described = _doc(cls)
            if cls in shared:
                lines.append(f"**{part}**: [`{cls.__name__}`](#{_anchor(_shared_heading(cls))}) "
                             f"(`{_source(cls)}`), shared with "
                             + ", ".join(f"`{n}`" for n in users[cls] if n != name) + "."
                             + (f" {described}" if described else ""))
                changed = [f for f in dataclasses.fields(cls) if f.name in command.defaults]
                if changed:
                    lines.append("This command's defaults: "
                                 + ", ".join(f"`--{f.name.replace('_', '-')} {_value(command.defaults[f.name])}`"
                                             for f in changed) + ".")
                continue
            lines.append(f"**{part}**: `{cls.__name__}` (`{_source(cls)}`)." + (f" {described}" if described else ""))
            lines.append("")
            lines += _option_rows(cls, command, fields)
    if shared:
        lines += ["", "## Options shared by several commands", "",
                  "The defaults here are the dataclass's; a command that sets its own says so in its section."]
        for cls in shared:
            described = _doc(cls)
            lines += ["", f"### {_shared_heading(cls)}", "",
                      f"`{_source(cls)}`; used by " + ", ".join(f"`trl-ext {n}`" for n in users[cls]) + "."
                      + (f" {described}" if described else ""), ""]
            lines += _option_rows(cls)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- results.md

# The command that wrote each result file, as markdown (the benchmark scripts' docstrings say the same).
RESULT_COMMANDS = {
    "targets-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/targets.py`",
    "kl-gap-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/kl_gap.py`",
    "rm-ablation-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/rm_ablation.py`",
    "throughput-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/throughput.py --policy runs/policy --reward runs/reward`",
    "throughput-cpu-separate-critic.json": "`OMP_NUM_THREADS=1 python benchmarks/throughput.py --policy runs/policy "
                                           "--reward runs/reward --separate-critic "
                                           "--out benchmarks/results/throughput-cpu-separate-critic.json`",
    "throughput-cpu-critic-free.json": "`OMP_NUM_THREADS=1 python benchmarks/throughput.py --policy demo_out/policy "
                                       "--reward demo_out/reward --backends scratch --separate-critic "
                                       "--advantage-estimators gae,grpo,rloo "
                                       "--out benchmarks/results/throughput-cpu-critic-free.json`",
    "memory-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/memory.py --policy runs/bench/policy "
                       "--reward runs/bench/reward`",
    "memory-options-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/memory_options.py`",
    "memory-scaling-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/memory_scaling.py "
                               "--rows 64x64/152k/float32 64x64/152k/bfloat16`",
    "memory-scaling-sweep-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/memory_scaling.py --options "
                                     "\"--num-ppo-epochs 1\" --out benchmarks/results/memory-scaling-sweep-cpu.json "
                                     "--rows 16x64/152k/float32 64x64/152k/float32 64x64/32k/float32 "
                                     "256x64/152k/float32`, the same with `--options \"--num-ppo-epochs 1 "
                                     "--micro-batch-size 13\" --rows 64x64/32k/float32`, and the code before "
                                     "(`git archive b0d3402 | tar -x -C /tmp/old`) measured by the same script with "
                                     "`--code /tmp/old --tag before --rows 16x64/152k/bfloat16 16x64/152k/float32`",
    "remote-reward-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/remote_reward.py --policy runs/policy "
                              "--reward runs/reward`",
    "rollout-engines-cpu.json": "`OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/rollout_engines.py`",
    "real-model-base-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/real_model_baseline.py`",
    "lm-head-slice-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/lm_head_slice.py`",
    "real-model-cpu.json": "sixteen row files gathered with `--collect` (the file's `command`), from these runs of "
                           "`OMP_NUM_THREADS=1 python benchmarks/real_model.py`: TRL's rows at commits 7922095 "
                           "(`--seeds 0,1` for all four rows) and 6d38256 (`--rows scratch-ppo,trl-ppo --seeds 2,3`; "
                           "their code has not changed since) and `--rows trl-grpo --seeds 2` and `--seeds 3`; "
                           "the scratch rows at commit feedc1c, `--rows scratch-ppo --eval-every 4` with `--seeds 0 --jobs 1`, "
                           "`--seeds 1,2` and `--seeds 3 --jobs 1`; trl-ext's GRPO rows at commit c489beb, `--rows "
                           "scratch-grpo --seeds 0,1,2,3 --set 'scale_rewards=\"none\"'` (the row's own setting since); "
                           "two rows ran at a time on the 2 cores",
    "real-model-cpu-whitened-seed0.json": "`OMP_NUM_THREADS=1 python benchmarks/real_model.py --rows scratch-ppo --seeds 0 "
                                          "--jobs 1 --eval-every 4 --set whiten_advantages=true --out "
                                          "benchmarks/results/real-model-cpu-whitened-seed0`, side by side with the "
                                          "same command without `--set` (the seed-0 row of `real-model-cpu.json`)",
    "real-model-cpu-grpo-std-scaled.json": "four row files gathered with `--collect` (the file's `command`) from "
                                           "`OMP_NUM_THREADS=1 python benchmarks/real_model.py --rows scratch-grpo` "
                                           "at commit feedc1c (then the row's settings were `kl_coef=0` alone): "
                                           "`--seeds 0,1` and `--seeds 2,3 --jobs 1`; the same rows now come from "
                                           "`--rows scratch-grpo --set 'scale_rewards=\"group\"'`",
    "rlhf-defaults-cpu.json": "`OMP_NUM_THREADS=1 python benchmarks/rlhf_defaults.py`: the number and positivity rows by "
                              "one invocation (before the LM-head change; its positivity-lr2e-4-guarded row not run), "
                              "the concise rows by another with `--rows concise-defaults,concise-before-lr2e-4,"
                              "concise-lr2e-4-guarded`, the seven runs gathered with `--collect` (the file's `command`)",
}


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _f(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _source_line(name: str) -> str:
    """Where a file's figures come from: the file, the command that wrote it, the machine."""
    data = _load(name)
    m = data.get("machine", {})
    parts = [f"{m['cpu_count']} CPU cores" if "cpu_count" in m else None,
             f"device {m['device']}" if "device" in m else None,
             f"{m['torch_threads']} torch thread{'' if m['torch_threads'] == 1 else 's'} a process"
             if "torch_threads" in m else None,
             f"torch {m['torch']}" if "torch" in m else None, f"trl {m['trl']}" if "trl" in m else None,
             f"Python {m['python']}" if "python" in m else None]
    machine = ", ".join(p for p in parts if p)
    command = RESULT_COMMANDS.get(name)
    made = f"made by {command}" if command else \
        f"its command not recorded in `scripts/gen_docs.py` (benchmark `{data.get('benchmark', '?')}`: see its script in `benchmarks/`)"
    return f"*Source: [`benchmarks/results/{name}`](../benchmarks/results/{name}), {made}; {machine or 'machine not recorded'}.*"


def _targets_rows(data) -> dict:
    return {label: rows for label, rows in data["per_seed"].items() if isinstance(rows, list)}


def block_targets_summary() -> tuple[str, list[str]]:
    data = _load("targets-cpu.json")
    lines = [_source_line("targets-cpu.json"), "",
             "| run | greedy exact, mean ± std | sampled exact, mean ± std | per seed (sampled) |",
             "|---|---|---|---|"]
    for label, rows in data["per_seed"].items():
        if not isinstance(rows, list):
            lines.append(f"| {label} | not run: {rows.get('not_run')} | | |")
            continue
        greedy, sampled = [r["greedy_exact"] for r in rows], [r["sampled_exact"] for r in rows]
        lines.append(f"| {label} | {statistics.fmean(greedy):.3f} ± {statistics.pstdev(greedy):.3f} | "
                     f"{statistics.fmean(sampled):.3f} ± {statistics.pstdev(sampled):.3f} | "
                     + " / ".join(f"{v:.3f}" for v in sampled) + " |")
    return "\n".join(lines), ["targets-cpu.json"]


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


def block_targets_critic_free() -> tuple[str, list[str]]:
    rows = _targets_rows(_load("targets-cpu.json"))
    lines = ["Seeds 0 / 1 / 2 (from the run above):", "",
             "| row | sampled exact | greedy exact | episodes/s | training s (two runs side by side) |",
             "|---|---|---|---|---|"]
    for label, text in CRITIC_FREE_LABELS.items():
        if label not in rows:
            continue
        per = rows[label]
        lines.append(f"| {text} | " + " | ".join(" / ".join(fmt(r[key]) for r in per) for key, fmt in (
            ("sampled_exact", lambda v: f"{v:.3f}"), ("greedy_exact", lambda v: f"{v:.3f}"),
            ("episodes_per_second", lambda v: f"{v:.0f}"), ("train_seconds", lambda v: f"{v:.0f}"))) + " |")
    return "\n".join(lines), ["targets-cpu.json"]


TARGET_COLUMNS = ("greedy_exact", "sampled_exact", "episodes_to_target", "seconds_to_target", "episodes_per_second",
                  "train_seconds", "final_kl")


def _target_cell(value) -> str:  # as benchmarks/targets.py writes its .md
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{value:,}"


def block_targets_per_seed() -> tuple[str, list[str]]:
    rows = _targets_rows(_load("targets-cpu.json"))
    lines = ["| run | seed | " + " | ".join(c.replace("_", " ") for c in TARGET_COLUMNS) + " |",
             "|" + "---|" * (len(TARGET_COLUMNS) + 2)]
    for label, per in rows.items():
        for seed, row in enumerate(per):
            lines.append(f"| {label} | {seed} | " + " | ".join(_target_cell(row.get(c)) for c in TARGET_COLUMNS)
                         + " |")
    return "\n".join(lines), ["targets-cpu.json"]


def block_targets_checks() -> tuple[str, list[str]]:
    data = _load("targets-cpu.json")
    checks = data["checks"]
    passed = sum(c["ok"] for c in checks)
    lines = [f"{passed} of {len(checks)} checks pass:", ""]
    lines += [f"- {'PASS' if c['ok'] else '**FAIL**'} {c['check']} ({c['value']})" for c in checks]
    if data.get("same_config_comparisons"):
        lines += ["", "Ours and TRL's trainer given the same config (reported, not checked):", ""]
        lines += [line if line.startswith("- ") else f"- {line}" for line in data["same_config_comparisons"]]
    return "\n".join(lines), ["targets-cpu.json"]


def block_targets_stages() -> tuple[str, list[str]]:
    stages = _load("targets-cpu.json")["stages"]
    lines = ["| stage | seconds | figures |", "|---|---|---|"]
    policy = stages.get("policy")
    if policy:
        spread = policy.get("charset_spread", {})
        lines.append(f"| pretraining (`pretrain`, {policy.get('processes', 1)} processes) | {_f(policy['seconds'], 1)} "
                     f"| greedy value_acc {_f(policy['value_acc'])}, sampled {_f(policy['sampled_value_acc'])}; "
                     "charsets written: " + ", ".join(f"{k} {_f(v)}" for k, v in spread.items()) + " |")
    reward = stages.get("reward")
    if reward:
        lines.append(f"| charset classifier (`train-reward`) | {_f(reward['seconds'], 1)} | held-out accuracy "
                     f"{_f(reward['heldout_accuracy'])} |")
    rm = stages.get("reward_model")
    if rm:
        kinds = ", ".join(f"{k.replace('_', ' ')} {_f(v)}" for k, v in rm.get("heldout_by_kind", {}).items())
        scores = rm.get("heldout_scores", {})
        score_text = "; ".join(f"{k} scores {scores[k]['mean']:.2f} ± {scores[k]['std']:.2f}"
                               for k in ("chosen", "rejected") if k in scores)
        lines.append(f"| reward model (`train-reward-model`) | {_f(rm['seconds'], 1)} | held-out pairwise "
                     f"{_f(rm['heldout_pairwise_accuracy'])} on {_f(rm.get('heldout_pairs'))} pairs; by kind: {kinds}; "
                     f"{score_text} |")
    return "\n".join(lines), ["targets-cpu.json"]


def block_kl_gap() -> tuple[str, list[str]]:
    data = _load("kl-gap-cpu.json")
    groups: dict[tuple, list] = {}
    for run in data["runs"]:
        groups.setdefault((run["critic"], run["value_head_init"], run["backend"]), []).append(run)
    lines = [_source_line("kl-gap-cpu.json") + f" {data.get('episodes', 0):,} episodes a run.", "",
             "| critic | value head init | backend | peak KL, per seed | final KL | sampled exact | greedy exact |",
             "|---|---|---|---|---|---|---|"]
    for (critic, init, backend), runs in groups.items():
        runs = sorted(runs, key=lambda r: r["seed"])
        lines.append(f"| {critic} | {init} | {backend} | " + " | ".join(
            " / ".join(f"{r[key]:.{digits}f}" for r in runs)
            for key, digits in (("peak_kl", 2), ("final_kl", 2), ("sampled_exact", 3), ("greedy_exact", 3))) + " |")
    seeds = sorted({r["seed"] for r in data["runs"]})
    lines += ["", f"Seeds {' / '.join(map(str, seeds))} in each cell.", "",
              "![KL to the reference, every run](../benchmarks/results/kl-gap-cpu.png)"]
    return "\n".join(lines), ["kl-gap-cpu.json"]


def block_rm_ablation() -> tuple[str, list[str]]:
    data = _load("rm-ablation-cpu.json")
    lines = [_source_line("rm-ablation-cpu.json") + f" Seed {data.get('seed', 0)}, one run per cell.", "",
             "| reward model | held-out pairwise | wrong value | right answers' score std | mean score gap |",
             "|---|---|---|---|---|"]
    for name, rm in data["reward_models"].items():
        lines.append(f"| {name} | {rm['pairwise']:.3f} | {rm['wrong_value']:.3f} | {rm['chosen_std']:.3f} | "
                     f"{rm['score_gap']:.3f} |")
    lines += ["", "| backend | reward model | rollout temperature | greedy exact | sampled exact | sampled value | "
                  "sampled charset |", "|---|---|---|---|---|---|---|"]
    for run in data["runs"]:
        lines.append(f"| {run['backend']} | {run['reward_model']} | {run['temperature']} | {run['greedy_exact']:.3f} | "
                     f"{run['sampled_exact']:.3f} | {run['sampled_value_acc']:.3f} | {run['sampled_charset_acc']:.3f} |")
    return "\n".join(lines), ["rm-ablation-cpu.json"]


def _throughput_settings(data) -> str:
    s = data["settings"]
    return (f"batch {s['batch_size']}, {s['num_ppo_epochs']} epochs, {s['num_mini_batches']} minibatch"
            f"{'es' if s['num_mini_batches'] != 1 else ''}, {s['updates']} timed updates after {s['warmup']} warm-ups")


def block_throughput() -> tuple[str, list[str]]:
    files = [("throughput-cpu.json", "shared backbone"),
             ("throughput-cpu-separate-critic.json", "separate critic (`--separate-critic`)")]
    lines = ["| value model | trl episodes/s | scratch episodes/s | scratch / trl | tokens/s trl / scratch |",
             "|---|---|---|---|---|"]
    sources = []
    for name, label in files:
        if not (RESULTS / name).exists():
            continue
        data = _load(name)
        rows = {r["backend"]: r for r in data["rows"]}
        trl, scratch = rows.get("trl"), rows.get("scratch")
        if not trl or not scratch:
            continue
        lines.append(f"| {label} | {trl['episodes_per_second']:.1f} | {scratch['episodes_per_second']:.1f} | "
                     f"{scratch['episodes_per_second'] / trl['episodes_per_second']:.2f}x | "
                     f"{trl['tokens_per_second']:,.0f} / {scratch['tokens_per_second']:,.0f} |")
        sources.append(name)
    head = [_source_line(name) + f" {_throughput_settings(_load(name)).capitalize()}." for name in sources]
    return "\n\n".join(head + ["\n".join(lines)]), sources


def block_throughput_critic_free() -> tuple[str, list[str]]:
    name = "throughput-cpu-critic-free.json"
    data = _load(name)
    lines = [_source_line(name) + f" {_throughput_settings(data).capitalize()}; the critic-free rows sample 8 completions a prompt.",
             "", "| row | episodes/s | seconds an update | trainable parameters |", "|---|---|---|---|"]
    for row in data["rows"]:
        lines.append(f"| `{row['backend']}` | {row['episodes_per_second']:.1f} | {row['seconds_per_update']:.3f} | "
                     f"{row.get('trainable_parameters', 0):,} |")
    return "\n".join(lines), [name]


def block_memory() -> tuple[str, list[str]]:
    name = "memory-cpu.json"
    data = _load(name)
    samples, s = data["samples"], data["settings"]
    return "\n".join([
        _source_line(name), "",
        f"{s['updates']:,} scratch updates at batch {s['batch_size']}: resident memory {samples[0]['rss_mb']} MB at "
        f"update {samples[0]['update']}, {samples[-1]['rss_mb']} MB at update {samples[-1]['update']} "
        f"(growth after warm-up: {data['growth_mb_after_warmup']} MB)."]), [name]


def block_memory_options() -> tuple[str, list[str]]:
    name = "memory-options-cpu.json"
    data = _load(name)
    s = data["settings"]
    lines = [_source_line(name) + f" A Qwen2-architecture policy built from a config (hidden {s['hidden']}, "
             f"{s['layers']} layers, vocabulary {s['vocab']:,}), batch {s['batch_size']}, {s['prompt_length']}-token "
             f"prompts and {s['response_length']}-token responses, {s['updates']} updates, each setting in a fresh "
             f"process; {data['measure']}.", "",
             "| setting | peak MB | trainable parameters | saved vs full + reference copy (MB) |",
             "|---|---|---|---|"]
    for row in data["rows"]:
        lines.append(f"| {row['setting']} | {row['peak_mb']:.1f} | {row['trainable']:,} of {row['parameters']:,} | "
                     f"{row['saved_mb_vs_full']:.1f} |")
    return "\n".join(lines), [name]


def _scaling_rows(data: dict, tag: str, epochs_default: str) -> list[str]:
    out = []
    for key, row in data.get(tag, {}).items():
        options = " ".join(row.get("options", []))
        epochs = "1" if "--num-ppo-epochs 1" in options else epochs_default
        extra = options.replace("--num-ppo-epochs 1", "").strip()
        peak = f"{row['peak_rss_gb']:.2f}" if "peak_rss_gb" in row else f"failed: `{row.get('failed', row.get('exit'))}`"
        out.append(f"| {tag} | {row['batch']} x {row['response_length']} / {row['vocab']:,} / {row['dtype']}"
                   f"{f' `{extra}`' if extra else ''} | {epochs} | {peak} | {row['seconds']:.1f} |")
    return out


def block_memory_scaling() -> tuple[str, list[str]]:
    names = [n for n in ("memory-scaling-cpu.json", "memory-scaling-sweep-cpu.json") if (RESULTS / n).exists()]
    lines = [line for n in names for line in (_source_line(n), "")]
    lines += ["| code | batch x response / vocabulary / checkpoint dtype | PPO epochs | peak RSS GB | wall s |",
              "|---|---|---|---|---|"]
    for name in names:
        data = _load(name)
        epochs = "1" if "sweep" in name else "4"
        for tag in ("before", "after"):
            lines += _scaling_rows(data, tag, epochs)
    return "\n".join(lines), names


def block_remote_reward() -> tuple[str, list[str]]:
    name = "remote-reward-cpu.json"
    data = _load(name)
    lines = [_source_line(name) + f" Server: {data.get('server', '?')}.", "",
             "| load test | requests | failed | requests/s | completions/s | p50 ms | p99 ms | max ms |",
             "|---|---|---|---|---|---|---|---|"]
    for reward, load in data["load"].items():
        lat = load["latency_ms"]
        lines.append(f"| {reward} reward, {load['clients']} clients x {load['requests_per_client']} requests x "
                     f"{load['rows_per_request']} completions | {load['requests']:,} | {load['failed']} | "
                     f"{load['requests_per_second']:.1f} | {load['completions_per_second']:,.0f} | {lat['p50']:.0f} | "
                     f"{lat['p99']:.0f} | {lat['max']:.0f} |")
    lines += ["", "| PPO run, reward scored | updates timed | batch | wall s | reward s | reward share of wall time |"
                  " final scores |", "|---|---|---|---|---|---|---|"]
    for run in data["ppo"]:
        lines.append(f"| {run['reward']} | {run['updates']} (after {run['warmup']}) | {run['batch_size']} | "
                     f"{run['wall_seconds']:.2f} | {run['reward_seconds']:.3f} | {run['reward_share']:.1%} | "
                     f"{run['final_scores']:.4f} |")
    lines += ["", f"Same final scores in-process and through the server: {_f(data.get('same_final_scores'))}."]
    return "\n".join(lines), [name]


def _cpu_source(name: str, per: str) -> str:
    """The source line of a file whose machine is ``{"cpu", "cores"}`` (the real-model benchmarks')."""
    data = _load(name)
    m = data["machine"]
    command = RESULT_COMMANDS.get(name) or f"`{data['command']}`"
    return (f"*Source: [`benchmarks/results/{name}`](../benchmarks/results/{name}), made by {command} on "
            f"{m['cpu']} ({m['cores']} cores), one torch thread a {per}.*")


def block_real_model() -> tuple[str, list[str]]:
    name = "real-model-cpu.json"
    data = _load(name)
    st = data["settings"]
    lines = [_cpu_source(name, "row"), "",
             f"{data['model']}; LoRA r={st['lora_r']} (alpha {st['lora_alpha']}, {st['lora_target_modules']}); "
             f"{st['batch_size']} rollouts an update, {st['num_ppo_epochs']} epochs, lr {st['learning_rate']} "
             f"({st['lr_scheduler_type']}), T={st['temperature']}, answers up to {st['response_length']} tokens, "
             f"{data['updates']} updates; {data['held_out_prompts']} held-out prompts. Score: `JustTheNumber`, "
             f"sampled at T={st['temperature']} (greedy in brackets). Rows ran {st['jobs']} side by side."
             + "".join(f" {trainer}: {', '.join(f'{k}={v}' for k, v in changed.items())}."
                       for trainer, changed in data.get("row_settings", {}).items() if changed), "",
             "| trainer | seed | episodes | held-out before | after | gain | s/update | update phases (s) | "
             "peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        phases = ", ".join(f"{k.split('/')[1]} {v:.1f}" for k, v in r["seconds_per_update_by_phase"].items()) or "-"
        lines.append(f"| {r['trainer']} | {r['seed']} | {r['episodes']} | {r['before']:.3f} ({r['before_greedy']:.3f})"
                     f" | {r['after']:.3f} ({r['after_greedy']:.3f}) | {r['after'] - r['before']:+.3f} | "
                     f"{r['seconds_per_update']:.1f} | {phases} | {r['peak_rss_mib']:,.0f} |")
    for f in data.get("failed", []):
        lines.append(f"| {f['trainer']} | {f['seed']} | failed (exit {f['returncode']}): {_cell(f['error'])} "
                     "| | | | | | |")
    by = {(r["trainer"], r["seed"]): r for r in data["rows"]}
    checks = []
    for seed in data["seeds"]:
        ours, theirs = by.get(("scratch-ppo", seed)), by.get(("trl-ppo", seed))
        if ours:
            checks.append(f"| seed {seed}: trl-ext PPO gains >= 0.4 (sampled) | {ours['after'] - ours['before']:+.3f} "
                          f"| {_f(ours['after'] - ours['before'] >= 0.4)} |")
        if ours and theirs:
            checks.append(f"| seed {seed}: trl-ext PPO held-out >= TRL 1.12 PPO's | {ours['after']:.3f} vs "
                          f"{theirs['after']:.3f} | {_f(ours['after'] >= theirs['after'])} |")
            ratio = ours["seconds_per_update"] / theirs["seconds_per_update"]
            checks.append(f"| seed {seed}: trl-ext PPO s/update <= 0.7x TRL's | {ratio:.2f}x | {_f(ratio <= 0.7)} |")
        free = [by[(n, seed)] for n in ("scratch-grpo", "scratch-rloo") if (n, seed) in by]
        if free and ("trl-grpo", seed) in by:
            grpo = by[("trl-grpo", seed)]
            checks.append(f"| seed {seed}: trl-ext {free[0]['trainer']} >= TRL GRPO | {free[0]['after']:.3f} vs "
                          f"{grpo['after']:.3f} | {_f(free[0]['after'] >= grpo['after'])} |")
    for ours_name, theirs_name in (("scratch-ppo", "trl-ppo"), ("scratch-grpo", "trl-grpo")):
        pairs = [(by[(ours_name, s)], by[(theirs_name, s)]) for s in data["seeds"]
                 if (ours_name, s) in by and (theirs_name, s) in by]
        if pairs:
            ours_mean, theirs_mean = (sum(p[i]["after"] for p in pairs) / len(pairs) for i in (0, 1))
            checks.append(f"| mean of {len(pairs)} seeds: {ours_name} held-out >= {theirs_name}'s | {ours_mean:.3f} vs "
                          f"{theirs_mean:.3f} | {_f(ours_mean >= theirs_mean)} |")
    lines += ["", "| target | measured | met |", "|---|---|---|", *checks, "",
              "![reward per update and against seconds, every row and seed](../benchmarks/results/real-model-cpu.png)"]
    return "\n".join(lines), [name]


def block_real_model_whitening() -> tuple[str, list[str]]:
    """Seed 0 of the scratch row with and without whitened advantages: held-out along the run, PPO's step sizes."""
    name, main = "real-model-cpu-whitened-seed0.json", "real-model-cpu.json"
    whitened = _load(name)["rows"][0]
    plain = next(r for r in _load(main)["rows"] if r["trainer"] == "scratch-ppo" and r["seed"] == whitened["seed"])
    lines = [_cpu_source(name, "row"), "",
             f"Seed {whitened['seed']}, the same settings but `whiten_advantages`; beside it the row of `{main}`. "
             "Held-out: sampled score of the 200 held-out prompts after the update; approx-KL: PPO's mean estimate of "
             "how far an update moved the policy on its own rollouts.", "",
             "| update | " + " | ".join(str(c["update"]) for c in plain["curve"]) + " |",
             "|---" * (len(plain["curve"]) + 1) + "|"]
    for label, row in (("whitened", whitened), ("not whitened", plain)):
        held = {c["update"]: c["held_out"] for c in row["curve"] if "held_out" in c}
        held[row["curve"][-1]["update"]] = row["after"]
        lines.append(f"| reward, {label} | " + " | ".join(f"{c['reward']:.2f}" for c in row["curve"]) + " |")
        lines.append(f"| approx-KL, {label} | " + " | ".join(f"{c.get('approxkl', float('nan')):.3f}"
                                                            for c in row["curve"]) + " |")
        lines.append(f"| held-out, {label} | " + " | ".join(f"**{held[c['update']]:.3f}**" if c["update"] in held
                                                           else "" for c in row["curve"]) + " |")
    return "\n".join(lines), [name]


def block_real_model_group_scaling() -> tuple[str, list[str]]:
    """trl-ext's GRPO row with its advantages divided by the group's std (TRL's GRPO default) and without (Dr. GRPO),
    beside TRL's GRPO, every seed."""
    name, main = "real-model-cpu-grpo-std-scaled.json", "real-model-cpu.json"
    scaled = {r["seed"]: r for r in _load(name)["rows"]}
    rows = _load(main)["rows"]
    unscaled = {r["seed"]: r for r in rows if r["trainer"] == "scratch-grpo"}
    trl = {r["seed"]: r for r in rows if r["trainer"] == "trl-grpo"}
    lines = [_cpu_source(name, "row"), "",
             "Held-out score after 320 episodes (sampled, greedy in brackets). The std-scaled rows are the computation "
             "TRL's GRPOTrainer makes per update (`tests/test_trl_group_equality.py`); the unscaled ones are the "
             f"`scratch-grpo` rows of `{main}`.", "",
             "| seed | trl-ext GRPO, advantages / group std (`scale_rewards=group`) | trl-ext GRPO, not scaled "
             "(`scale_rewards=none`) | TRL GRPO (`scale_rewards=group`) |", "|---|---|---|---|"]
    cell = lambda r: f"{r['after']:.3f} ({r['after_greedy']:.3f})" if r else "-"  # noqa: E731
    for seed in sorted(set(scaled) | set(unscaled) | set(trl)):
        lines.append(f"| {seed} | {cell(scaled.get(seed))} | {cell(unscaled.get(seed))} | {cell(trl.get(seed))} |")
    means = [sum(r["after"] for r in d.values()) / len(d) for d in (scaled, unscaled, trl)]
    lines.append("| mean | " + " | ".join(f"{m:.3f}" for m in means) + " |")
    return "\n".join(lines), [name]


def _run_label(run: dict, trainer: str) -> str:
    """A column of the GPU table: the trainer and the settings its invocation changed (``--set``)."""
    words = run["command"].split()
    changed = [after for before, after in zip(words, words[1:]) if before == "--set"]
    changed += [run["column_notes"][trainer]] if trainer in run.get("column_notes", {}) else []
    return trainer + (f" ({', '.join(c.replace(chr(34), '') for c in changed)})" if changed else "")


def block_real_model_gpu() -> tuple[str, list[str]]:
    name = "real-model-gpu-h100.json"
    data = _load(name)
    first = data["runs"][0]["rows"][0]
    columns: dict[str, dict[int, dict]] = {}
    for run in data["runs"]:
        for r in run["rows"]:
            columns.setdefault(_run_label(run, r["trainer"]), {})[r["seed"]] = r
    seeds = sorted({seed for col in columns.values() for seed in col})
    commands = "; ".join(f"`{run['command']}` ({run['wall_seconds']:.0f} s)" for run in data["runs"])
    lines = [f"*Source: [`benchmarks/results/{name}`](../benchmarks/results/{name}), made by {commands} on "
             f"{data['device']} with {data['runs'][0]['machine']['cores']} CPU cores, torch {first['torch']}, every "
             f"row a process with one torch thread, the rows of an invocation side by side on the one GPU. {data['how']}*", "",
             "Held-out score after training (sampled at T=0.7, greedy in brackets), every seed; the settings are the "
             "CPU run's except what a column names. Before training: "
             + ", ".join(f"seed {s} {next(c[s]['before'] for c in columns.values() if s in c):.3f}" for s in seeds)
             + ".", "",
             "| seed | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for seed in seeds:
        cells = [f"{c[seed]['after']:.3f} ({c[seed]['after_greedy']:.3f})" if seed in c else "-"
                 for c in columns.values()]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    mean = [sum(r["after"] for r in c.values()) / len(c) for c in columns.values()]
    lines.append("| mean | " + " | ".join(f"{m:.3f}" for m in mean) + " |")
    lines.append("| s/update, mean | " + " | ".join(
        f"{sum(r['seconds_per_update'] for r in c.values()) / len(c):.2f}" for c in columns.values()) + " |")
    lines.append("| peak GPU MiB | " + " | ".join(
        f"{max(r['peak_gpu_mib'] for r in c.values()):,.0f}" for c in columns.values()) + " |")
    return "\n".join(lines), [name]


def block_rlhf_defaults() -> tuple[str, list[str]]:
    name = "rlhf-defaults-cpu.json"
    data = _load(name)
    size = data["run_size"]
    lines = [_cpu_source(name, "run"), "",
             f"`trl-ext rlhf` on {data['policy']}: {size['updates']} updates of {size['batch_size']} prompts, answers "
             f"up to {size['response_length']} tokens, everything else the recipe's defaults except what a row "
             "changes. KL: per answer, summed over its tokens.", "",
             "| row | reward | changed from the defaults | reward, first 5 -> last 5 updates | KL max / last 5 | "
             "answer tokens, first 5 -> last 5 (min) | KL weight at the end |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if "failed" in r:
            lines.append(f"| {r['row']} | failed (exit {r['failed']}) | | | | | |")
            continue
        changed = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "nothing"
        lines.append(f"| {r['row']} | {r['reward']} | {changed} | {r['reward_first5']:.3f} -> {r['reward_last5']:.3f} "
                     f"| {r['kl_max']:.2f} / {r['kl_last5']:.2f} | {r['length_first5']:.1f} -> "
                     f"{r['length_last5']:.1f} ({r['length_min']:.1f}) | {_f(r['kl_coef_last'], 4)} |")
    return "\n".join(lines), [name]


def block_lm_head_slice() -> tuple[str, list[str]]:
    name = "lm-head-slice-cpu.json"
    data = _load(name)
    rows, positions, hidden = data["rows_positions_hidden"]
    lines = [_cpu_source(name, "process"), "",
             f"torch {data['torch']}: the head over the last positions of {rows} rows of {positions} positions (hidden "
             f"{hidden}), the median of {data['repeats']} calls each.", "",
             "| head | dtype | positions kept | gradients | int `logits_to_keep` s | indices s | int slower by |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['head']} | {r['dtype']} | {r['kept']} | {_f(r['grad'])} | {r['int_seconds']:.3f} | "
              f"{r['index_seconds']:.3f} | {r['slower_by']:.0f}x |" for r in data["rows"]]
    return "\n".join(lines), [name]


BLOCKS = {
    "targets-summary": block_targets_summary,
    "targets-stages": block_targets_stages,
    "targets-critic-free": block_targets_critic_free,
    "targets-per-seed": block_targets_per_seed,
    "targets-checks": block_targets_checks,
    "kl-gap": block_kl_gap,
    "rm-ablation": block_rm_ablation,
    "throughput": block_throughput,
    "throughput-critic-free": block_throughput_critic_free,
    "memory": block_memory,
    "memory-options": block_memory_options,
    "memory-scaling": block_memory_scaling,
    "remote-reward": block_remote_reward,
    "real-model": block_real_model,
    "real-model-gpu": block_real_model_gpu,
    "real-model-whitening": block_real_model_whitening,
    "real-model-group-scaling": block_real_model_group_scaling,
    "rlhf-defaults": block_rlhf_defaults,
    "lm-head-slice": block_lm_head_slice,
}
BLOCK = re.compile(r"(<!-- BEGIN generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END generated: (?P=name) -->)",
                   re.S)


def _flatten(value, prefix: str = "") -> list[tuple[str, object]]:
    if isinstance(value, dict):
        return [item for key, sub in value.items() if key not in ("machine", "curve")
                for item in _flatten(sub, f"{prefix}.{key}" if prefix else str(key))]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [item for i, sub in enumerate(value) for item in _flatten(sub, f"{prefix}[{i}]")]
    return [(prefix, value)]


def block_other_results(used: set[str]) -> str:
    """Every result file that no block above renders, listed plainly (so a new result is never left out)."""
    others = sorted(p.name for p in RESULTS.glob("*.json") if p.name not in used)
    if not others:
        return "Every file in `benchmarks/results/` is shown above."
    lines = []
    for name in others:
        lines += [f"### `{name}`", "", _source_line(name), "", "| key | value |", "|---|---|"]
        for key, value in _flatten(_load(name))[:200]:
            text = repr(value) if isinstance(value, float) else json.dumps(value) if isinstance(value, (list, dict)) \
                else _f(value)
            lines.append(f"| `{key}` | {_cell(text)} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def block_written_table(name: str) -> tuple[str, list[str]]:
    """A benchmark that writes its own table (``NAME.md`` beside ``NAME.json``, whose ``commands`` made it): the
    table as written, under its source line. No renderer of its own here."""
    data = _load(f"{name}.json")
    m = data.get("machine", {})
    machine = ", ".join(str(m[k]) for k in ("cpu", "device") if k in m) + \
        (f", {m['cpu_count']} cores, torch {m['torch']}, trl {m.get('trl', '-')}" if "cpu_count" in m else "")
    commands = "; ".join(f"`{c}`" for c in data.get("commands", [])) or "not recorded"
    source = (f"*Source: [`benchmarks/results/{name}.json`](../benchmarks/results/{name}.json), made by {commands}; "
              f"{machine}.*")
    return source + "\n\n" + (RESULTS / f"{name}.md").read_text(), [f"{name}.json"]


def _written_table(name: str) -> bool:
    return (RESULTS / f"{name}.md").exists() and (RESULTS / f"{name}.json").exists()


def results_page(text: str) -> str:
    """The page with every generated block rewritten from benchmarks/results/*.json."""
    used: set[str] = set()
    found = [m.group("name") for m in BLOCK.finditer(text)]
    unknown = [n for n in found if n not in BLOCKS and n != "other-results" and not _written_table(n)]
    if unknown:
        raise SystemExit(f"{RESULTS_PAGE.relative_to(ROOT)}: unknown generated block(s) {unknown}; known: "
                         f"{', '.join([*BLOCKS, 'other-results'])}")
    if "other-results" not in found:
        raise SystemExit(f"{RESULTS_PAGE.relative_to(ROOT)} needs an 'other-results' block")
    rendered = {}
    for name in found:
        if name != "other-results":
            body, files = BLOCKS[name]() if name in BLOCKS else block_written_table(name)
            rendered[name] = body
            used.update(files)
    rendered["other-results"] = block_other_results(used)
    return BLOCK.sub(lambda m: m.group(1) + rendered[m.group("name")].rstrip() + "\n" + m.group(4), text)


# ---------------------------------------------------------------------------------------------- main


def pages() -> dict[Path, str]:
    return {COMMANDS_PAGE: commands_page(), RESULTS_PAGE: results_page(RESULTS_PAGE.read_text())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help=f"write nothing; exit {STALE} if a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in pages().items():
        current = path.read_text() if path.exists() else ""
        if current == text:
            continue
        if args.check:
            stale.append(path)
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), f"{path.relative_to(ROOT)} (committed)",
                                        f"{path.relative_to(ROOT)} (generated now)", lineterm="", n=1)
            print("\n".join(list(diff)[:60]))
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date: {', '.join(str(p.relative_to(ROOT)) for p in stale)}; regenerate with `{REGENERATE}` "
              "and commit the result")
        return STALE
    return 0


if __name__ == "__main__":
    sys.exit(main())
