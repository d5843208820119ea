"""PPO and group baselines on the real model: held-out score before and after, on CPU or a GPU.

    OMP_NUM_THREADS=1 python benchmarks/real_model.py --quick     # smoke run: 1 seed, 2 updates, 16 held-out prompts
    OMP_NUM_THREADS=1 python benchmarks/real_model.py             # full: seeds 0 and 1, 20 updates, 200 held-out
    OMP_NUM_THREADS=1 python benchmarks/real_model.py --plan benchmarks/plans/real-model-fair.json   # a committed plan

Every row trains SmolLM2-135M-Instruct (bf16, ``trl_ext.tasks.real_model.checkpoint.fetch_smollm2``) with LoRA r=16
(alpha 32, all linear layers) on ``trl_ext.tasks.real_model.task``'s training stream, rewarded by ``JustTheNumber``,
with SETTINGS: 16 rollouts an update, 2 epochs over each, lr 1.5e-4 (constant), temperature 0.7, responses up to
32 tokens, the value head (PPO rows) starting at zero, the KL weight fixed at PPOConfig's 0.05 in the PPO rows and
none in the GRPO rows (TRL's GRPO at its default beta=0 has no KL term); the scratch row does not whiten its
advantages (TRL's PPO always does) and trl-ext's GRPO row does not divide them by the group's std (TRL's GRPO does
by default). ``--set FIELD=JSON`` changes a setting for
every row. On a machine with CUDA every row trains and evaluates there. Rows:

* ``scratch-ppo``  trl-ext's PPOTrainer, critic and GAE (``.venv``);
* ``trl-ppo``      TRL 1.12's PPOTrainer through trl-ext's ``trl`` runner (``.venv``);
* ``scratch-grpo`` trl-ext's PPOTrainer with ``advantage_estimator='grpo'``, 4 generations a prompt (``.venv``);
* ``trl-grpo``     the newest TRL's GRPOTrainer through trl-ext's ``grpo`` runner, 4 generations (``.venv-latest``);
* ``scratch-ppo-gen4`` trl-ext's PPO, critic and GAE, 4 generations a prompt (only where ``--rows`` or a plan names it).

Each row is a subprocess with one torch thread (``--jobs`` side by side). Per row: the held-out score before and
after training (greedy and sampled at T=0.7, ``trl_ext.tasks.real_model.evaluate``), the reward and KL per update and
against seconds, the trainer's ``timing/*`` stats per update (trl-ext's rows; TRL's trainers report none), seconds
per update, and peak memory (``resource.getrusage`` maxrss). Writes benchmarks/results/real-model-cpu.json
(quick: real-model-cpu-quick.json), a .md beside it and a curves .png. Only measured rows are written.

Every row records its ``settings`` in full, resolved: every PPOConfig field that shapes what is computed (the
estimator's whitening default filled in), the LoRA and precision, and for TRL's trainers the values they fix
where our config has a choice (``TRL_PPO_FIXED``, ``TRL_GRPO_FIXED``), so that two rows' settings can be compared
key by key; engine and memory options (the sampler, batch sizes of passes) are recorded apart, as
``implementation``.

``--plan FILE`` runs a plan committed before it runs (``benchmarks/plans/``, read by ``read_plan``): its rows with
their settings, seeds, evaluation split, updates and jobs, nothing from the command line but ``--quick`` (the first
seed, 2 updates, 16 prompts), a subset of its ``--seeds`` or of its whole pairs (``--rows``), ``--out`` and
``--collect``. The two rows of a pair run side by side in one invocation (jobs ordered seed by seed, each pair's
rows one after the other, so that load falls on both alike), every row records the invocation's id, and the
results list per pair the settings keys in which its rows differ (computed from the rows' own records, beside the
keys the plan declares) and the ratio of their seconds per update in each invocation, never across invocations.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import (  # noqa: E402
    ROOT,
    VENVS,
    PlanError,
    check_pairs_and_extras,
    check_positive_integers,
    check_seeds,
    command_line,
    comparisons,
    evaluating,
    git_commit,
    new_invocation_id,
    plan_jobs,
    read_plan_file,
    repository_path,
    run_jobs,
    write_results,
)

ROWS = {  # name -> (virtual environment, trl-ext runner, advantage estimator, generations per prompt, settings)
    # Advantages not whitened: over a batch where most answers earn the same score, whitening blows the few
    # failures up to several standard deviations and PPO takes its largest steps there (docs/real-model.md).
    "scratch-ppo": (".venv", "scratch", "gae", 1, {"whiten_advantages": False}),
    "trl-ppo": (".venv", "trl", "gae", 1, {}),
    # The critic with several samples a prompt (VAPO): the same episodes, a quarter of the prompts (issue 51)
    "scratch-ppo-gen4": (".venv", "scratch", "gae", 4, {"whiten_advantages": False}),
    # No KL term, as TRL's GRPOTrainer at its default beta=0; advantages not divided by the group's std (Dr. GRPO,
    # the GRPO rows' counterpart of the PPO row's unwhitened advantages: docs/real-model.md). With
    # scale_rewards="group" the row is TRL's GRPO per update (tests/test_trl_group_equality.py).
    "scratch-grpo": (".venv", "scratch", "grpo", 4, {"kl_coef": 0.0, "scale_rewards": "none"}),
    "trl-grpo": (".venv-latest", "grpo", "grpo", 4, {"kl_coef": 0.0}),
}
PLAIN_ROWS = ("scratch-ppo", "trl-ppo", "scratch-grpo", "trl-grpo")  # what runs without --rows or --plan
SETTINGS = dict(
    batch_size=16,
    learning_rate=1.5e-4,
    lr_scheduler_type="constant",
    temperature=0.7,
    response_length=32,
    num_ppo_epochs=2,
    value_head_init="zero",
    lora_r=16,
    lora_alpha=32,
    dtype="bfloat16",
    torch_threads=1,
)
OVERRIDES: dict = {}  # --set: wins over a row's own settings
NOT_CONFIG = ("lora_r", "lora_alpha", "dtype", "torch_threads")  # SETTINGS that are not PPOConfig fields
QUICK = dict(seeds=[0], updates=2, heldout=16)
FULL = dict(seeds=[0, 1], updates=20, heldout=200)
# PPOConfig fields that choose an engine, a memory layout or bookkeeping, not what is computed: recorded as a row's
# ``implementation``, left out of its ``settings`` (and so of the keys in which a pair differs)
IMPLEMENTATION = (
    "output_dir",
    "seed",
    "sampler",
    "local_rollout_forward_batch_size",
    "micro_batch_size",
    "gradient_checkpointing",
    "save_steps",
    "save_total_limit",
    "resume_from_checkpoint",
    "report_to",
    "torch_threads",
)
LORA = dict(lora_target_modules="all-linear", lora_dropout=0.0)  # what every row's LoraConfig adds to SETTINGS
PLAN_KEYS = {
    "name",
    "about",
    "split",
    "updates",
    "eval_prompts",
    "seeds",
    "jobs",
    "settings",
    "rows",
    "pairs",
    "extras",
}


def prompt_dataset(tokenizer, n: int, seed: int):
    import itertools

    from datasets import Dataset

    from trl_ext.tasks.real_model.task import train_stream

    rows = list(itertools.islice(train_stream(seed), n))
    ids = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True) for r in rows]
    ids = [i["input_ids"] if isinstance(i, dict) or hasattr(i, "keys") else i for i in ids]
    return Dataset.from_dict(
        {"prompt": [r["prompt"] for r in rows], "answer": [r["answer"] for r in rows], "input_ids": ids}
    )


def sampled_score(model, tokenizer, rows, seed: int, examples: int = 3) -> dict:
    """The held-out score sampled as the rollouts are (SETTINGS' temperature and length), seeded by ``seed + 1``."""
    from trl_ext.tasks.real_model.evaluate import score_rows

    return score_rows(
        model,
        tokenizer,
        rows,
        temperature=SETTINGS["temperature"],
        max_new_tokens=SETTINGS["response_length"],
        seed=seed + 1,
        examples=examples,
    )


def held_out(model, tokenizer, rows, seed: int) -> dict:
    from trl_ext.tasks.real_model.evaluate import score_rows

    model.eval()
    greedy = score_rows(model, tokenizer, rows, max_new_tokens=SETTINGS["response_length"], examples=3)
    return {"greedy": greedy, "sampled": sampled_score(model, tokenizer, rows, seed)}


def settings_of(name: str) -> dict:
    """A row's settings: SETTINGS, the row's own over them, ``--set`` over both."""
    return {**SETTINGS, **ROWS[name][4], **OVERRIDES}


# ---------------------------------------------------------------------------------------- settings, resolved


def row_config(kind: str, settings: dict, updates: int, seed: int = 0, output_dir: str | None = None):
    """The ``PPOConfig`` a row of ``kind`` (a ``ROWS`` name) trains with: ``settings``' config fields, the row's
    estimator and generations, ``updates`` updates."""
    from trl_ext.ppo.config import PPOConfig

    _, _, estimator, generations, _ = ROWS[kind]
    fields = {k: v for k, v in settings.items() if k not in NOT_CONFIG}
    return PPOConfig(
        output_dir=output_dir,
        total_episodes=updates * settings["batch_size"],
        seed=seed,
        advantage_estimator=estimator,
        num_generations=generations,
        **fields,
    )


def fixed_by_runner(runner: str) -> dict:
    """What the trainer behind ``runner`` does where our PPOConfig has a choice (TRL's; ours: nothing fixed)."""
    from trl_ext.runs.runners import trl_trainer

    return {} if runner == "scratch" else dict(trl_trainer(runner)[2])


def resolved_settings(kind: str, settings: dict, updates: int) -> tuple[dict, dict, dict]:
    """``(settings, implementation, not_expressible)`` of a row: every PPOConfig field that shapes the computation,
    the estimator's whitening default filled in, the LoRA and precision, and where the row's trainer fixes a value
    (TRL's), that value; the engine and memory fields apart; and ``{key: [asked, what the trainer runs]}`` for each
    value the row asked for that its trainer cannot run."""
    from dataclasses import fields

    from trl_ext.ppo.advantages import whitens
    from trl_ext.runs.runners import fixed_differences

    cfg = row_config(kind, settings, updates)
    method, implementation = {}, {}
    for f in fields(cfg):
        implemented = f.name in IMPLEMENTATION or f.name.startswith("vllm_")
        (implementation if implemented else method)[f.name] = getattr(cfg, f.name)
    method["whiten_advantages"] = whitens(cfg)
    for key in NOT_CONFIG:
        if key in settings:
            (implementation if key in IMPLEMENTATION else method)[key] = settings[key]
    method.update(LORA)
    runner = ROWS[kind][1]
    not_expressible = {k: list(v) for k, v in fixed_differences(runner, cfg).items()}
    method.update(fixed_by_runner(runner))
    return method, implementation, not_expressible


# ---------------------------------------------------------------------------------------- plans


def read_plan(path: str | Path) -> dict:
    """A plan file (JSON), checked and resolved: each row's ``settings`` become the plan's common ``settings`` with
    the row's own over them (complete: every key of SETTINGS must be in the common block, so the plan does not
    depend on this file's defaults); every row is in one pair or is an extra; a TRL row asks for nothing its trainer
    cannot run. Adds ``path`` and ``sha256`` (of the file's bytes)."""
    from trl_ext.tasks.real_model.task import SPLITS, eval_rows

    plan = read_plan_file(path, PLAN_KEYS, PLAN_KEYS - {"name", "about", "extras"})
    if plan["split"] not in SPLITS:
        raise PlanError(f"{path}: split {plan['split']!r} is not one of {sorted(SPLITS)}")
    check_seeds(path, plan["seeds"])
    check_positive_integers(path, plan, ("updates", "jobs", "eval_prompts"))
    if plan["eval_prompts"] > len(eval_rows(plan["split"])):
        raise PlanError(f"{path}: eval_prompts {plan['eval_prompts']} is more than split {plan['split']!r} has")
    common = plan["settings"]
    if set(SETTINGS) - set(common):
        raise PlanError(
            f"{path}: the common settings must name every setting the benchmark has; missing "
            f"{sorted(set(SETTINGS) - set(common))}"
        )
    rows = {}
    for name, row in plan["rows"].items():
        if set(row) - {"kind", "settings", "about"} or row.get("kind") not in ROWS:
            raise PlanError(f"{path}: row {name!r} needs a kind of {list(ROWS)} (and optionally settings, about)")
        own = row.get("settings", {})
        if {"advantage_estimator", "num_generations"} & set(own):
            raise PlanError(f"{path}: row {name!r}: its kind fixes advantage_estimator and num_generations")
        settings = {**common, **own}
        try:
            _, _, not_expressible = resolved_settings(row["kind"], settings, plan["updates"])
        except Exception as err:  # a PPOConfig that refuses the settings: say which row
            raise PlanError(f"{path}: row {name!r}: {err}") from None
        if not_expressible:
            raise PlanError(
                f"{path}: row {name!r} asks its trainer for what it cannot run ([asked, runs]): {not_expressible}"
            )
        rows[name] = dict(row, settings=settings)
    pairs, extras = plan["pairs"], plan.get("extras", {})
    check_pairs_and_extras(path, pairs, extras, rows)
    return dict(plan, rows=rows, pairs=pairs, extras=extras)


def held_out_during(policy, tokenizer, rows, seed: int) -> float:
    """The sampled held-out score in the middle of training (``evaluating``)."""
    with evaluating(policy):
        return sampled_score(policy, tokenizer, rows, seed, examples=0)["score"]


def run_row(
    name: str,
    seed: int,
    updates: int,
    heldout: int,
    out: Path,
    eval_every: int = 0,
    *,
    kind: str | None = None,
    settings: dict | None = None,
    split: str = "heldout",
    invocation: str | None = None,
) -> None:
    """One row, in this process: train, evaluate before and after on ``split``'s first ``heldout`` prompts, write
    its JSON to ``out``. ``kind`` (a ``ROWS`` name, default ``name``) and ``settings`` (default: ``settings_of``)
    come from a plan's row."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.runs.runners import RUNNERS, RunInputs
    from trl_ext.tasks.real_model.checkpoint import fetch_smollm2
    from trl_ext.tasks.real_model.task import JustTheNumber, eval_rows

    torch.set_num_threads(1)
    kind = kind or name
    settings = settings_of(name) if settings is None else settings
    _, runner_name, estimator, generations, _ = ROWS[kind]
    SETTINGS.update(settings)
    folder = fetch_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    if torch.cuda.is_available():  # the trainers run on the accelerator's device; evaluate there before as after
        model.to("cuda")
    rows = eval_rows(split)[:heldout]
    t0 = time.perf_counter()
    before = held_out(model, tokenizer, rows, seed)
    eval_before_s = time.perf_counter() - t0

    lora = LoraConfig(
        task_type="CAUSAL_LM",
        r=SETTINGS["lora_r"],
        lora_alpha=SETTINGS["lora_alpha"],
        lora_dropout=0.0,
        target_modules="all-linear",
    )
    work = tempfile.mkdtemp(prefix=f"real-model-{name}-")
    cfg = row_config(kind, settings, updates, seed, work)
    resolved, implementation, not_expressible = resolved_settings(kind, settings, updates)
    policy, peft_config = model, lora
    if runner_name in ("grpo", "rloo"):  # trl-ext's group runners take a ready policy: the adapter goes on here
        policy, peft_config = get_peft_model(model, lora), None
    inputs = RunInputs(
        cfg,
        policy,
        tokenizer,
        JustTheNumber(),
        prompts=lambda n: prompt_dataset(tokenizer, n, seed),
        peft_config=peft_config,
    )
    runner = RUNNERS[runner_name](inputs)
    implementation["sampler"] = runner.trainer.sampler_name if runner_name == "scratch" else "the trainer's own"
    curve = []
    evaluating = [0.0]  # seconds spent on held-out scores during training: not training time
    start = time.perf_counter()

    def on_update(update, stats) -> bool:
        curve.append(
            {
                "update": int(update),
                "seconds": round(time.perf_counter() - start - evaluating[0], 2),
                "reward": float(stats["objective/scores"]),
                "kl": round(float(stats.get("objective/kl", "nan")), 4),
                **{
                    metric: round(float(stats[key]), 4)
                    for metric, key in (
                        ("approxkl", "policy/approxkl_avg"),
                        ("clipfrac", "policy/clipfrac_avg"),
                        ("explained_variance", "val/explained_variance"),
                        ("explained_variance_pooled", "val/explained_variance_pooled"),
                        ("returns_var", "val/returns_var"),
                        ("first_value_return_corr", "val/first_value_return_corr"),
                        ("value_loss", "loss/value_avg"),
                    )
                    if key in stats
                },
                **{k: round(float(v), 4) for k, v in stats.items() if k.startswith("timing/")},
            }
        )
        if eval_every and int(update) % eval_every == 0 and int(update) < updates:
            t0 = time.perf_counter()
            curve[-1]["held_out"] = held_out_during(runner.policy, tokenizer, rows, seed)
            evaluating[0] += time.perf_counter() - t0
        print(
            f"[{name} seed {seed}] update {update} reward {curve[-1]['reward']:.3f} held-out "
            f"{curve[-1].get('held_out', '-')} at {curve[-1]['seconds']} s",
            flush=True,
        )
        return False

    runner.train(on_update)
    train_s = time.perf_counter() - start - evaluating[0]
    t0 = time.perf_counter()
    after = held_out(runner.policy, tokenizer, rows, seed)
    eval_after_s = time.perf_counter() - t0
    phases = sorted({k for c in curve for k in c if k.startswith("timing/") and k != "timing/elapsed"})
    import trl

    row = {
        "task": "number",
        "trainer": name,
        "kind": kind,
        "runner": runner_name,
        "estimator": estimator,
        "advantage_estimator": estimator,
        "num_generations": generations,
        "seed": seed,
        "invocation": invocation,
        "updates": len(curve),
        "episodes": len(curve) * SETTINGS["batch_size"],
        "split": split,
        "held_out_prompts": len(rows),
        # The KL logged at update 1, before any step, while the policy equals its reference (LoRA's B = 0): about 0
        # unless the rollout's log-probs and the reference's disagree (6-12 nats in TRL's row after right padding)
        # (None where no KL is computed: the GRPO rows, without a KL term, have no reference pass)
        "update1_kl": next((c["kl"] for c in curve if c["update"] == 1 and c["kl"] == c["kl"]), None),
        "before": before["sampled"]["score"],
        "after": after["sampled"]["score"],
        "before_greedy": before["greedy"]["score"],
        "after_greedy": after["greedy"]["score"],
        "before_detail": before,
        "after_detail": after,
        "train_seconds": round(train_s, 1),
        "seconds_per_update": round(train_s / max(1, len(curve)), 2),
        "seconds_per_update_by_phase": {p: round(sum(c.get(p, 0.0) for c in curve) / len(curve), 3) for p in phases},
        "eval_seconds": {
            "before": round(eval_before_s, 1),
            "after": round(eval_after_s, 1),
            "during": round(evaluating[0], 1),
        },
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        # full and resolved (resolved_settings); what the trainer fixes over what was asked, where they differ
        "settings": resolved,
        "implementation": implementation,
        "settings_not_expressible": not_expressible,
        "curve": curve,
        "python": sys.executable,
        "trl": trl.__version__,
        "torch": torch.__version__,
    }
    out.write_text(json.dumps(row, indent=2, ensure_ascii=False) + "\n")


def row_settings(rows: list[dict]) -> dict:
    """Per trainer, the settings its rows ran with that differ from SETTINGS (as each row recorded them): among
    SETTINGS' keys, the row's own and ``--set``'s (a row records every setting; the rest are PPOConfig's defaults)."""
    changed = {}
    for r in rows:
        if "settings" in r:
            own = set(ROWS.get(r.get("kind", r["trainer"]), ({},) * 5)[4]) | set(OVERRIDES)
            changed.setdefault(r["trainer"], {}).update(
                {
                    k: v
                    for k, v in r["settings"].items()
                    if (k in SETTINGS and SETTINGS[k] != v) or (k not in SETTINGS and k in own)
                }
            )
    return changed


def write_outputs(
    rows: list[dict], failed: list[dict], meta: dict, stem: Path, found: list[dict] | None = None
) -> None:
    from benchmarks.real_model_tables import results_table

    extra = {} if found is None else {"comparisons": found}
    write_results(
        stem.with_suffix(".json"),
        dict(meta, rows=rows, failed=failed, **extra),
        lambda data: results_table(data, stem.with_suffix(".json").name, f"`{meta['command']}`"),
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
        names = dict.fromkeys([*ROWS, *(r["trainer"] for r in rows)])
        colour = {name: f"C{i % 10}" for i, name in enumerate(names)}  # one colour a trainer, one line a seed
        for r in rows:
            c, label = colour.get(r["trainer"], "k"), r["trainer"]
            a.plot(
                [x["update"] for x in r["curve"]],
                [x["reward"] for x in r["curve"]],
                color=c,
                alpha=0.6,
                marker=".",
                label=label,
            )
            b.plot(
                [x["seconds"] for x in r["curve"]],
                [x["reward"] for x in r["curve"]],
                color=c,
                alpha=0.6,
                marker=".",
                label=label,
            )
            held = (
                [(0, r["before"])]
                + [(x["update"], x["held_out"]) for x in r["curve"] if "held_out" in x]
                + [(r["curve"][-1]["update"], r["after"])]
            )
            if len(held) > 2:  # --eval-every: the held-out score along the run, dashed in the trainer's colour
                a.plot(*zip(*held), linestyle="--", marker="x", color=c, label=f"{label} held-out")
        a.set_xlabel("update"), b.set_xlabel("seconds of training"), a.set_ylabel("mean training reward")
        handles = dict(zip(*reversed(a.get_legend_handles_labels())))  # one entry a label, every seed drawn
        fig.legend(handles.values(), handles.keys(), loc="center right", fontsize=8)
        fig.subplots_adjust(right=0.8)
        fig.suptitle(f"{stem.name}: every seed a line; held-out dashed where measured along the run")
        fig.savefig(stem.with_suffix(".png"), dpi=100)
        plt.close(fig)
    except ImportError as err:
        print(f"no curves PNG: {err}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", metavar="FILE", help="run this committed plan (benchmarks/plans/*.json) as written")
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 updates, the first 16 held-out prompts")
    parser.add_argument(
        "--rows", help="comma-separated, of " + ", ".join(ROWS) + " (with --plan: of its rows, whole pairs)"
    )
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--updates", type=int)
    parser.add_argument("--seeds", help="comma-separated (with --plan: some of its seeds)")
    parser.add_argument("--heldout", type=int)
    parser.add_argument(
        "--eval-every",
        type=int,
        default=0,
        metavar="N",
        help="also score the held-out set (sampled) after every N-th update, into the curves",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=JSON",
        help="override one of SETTINGS for every row, e.g. --set whiten_advantages=false (repeatable)",
    )
    parser.add_argument(
        "--out",
        help="results stem (default benchmarks/results/real-model-cpu[-quick]; with --plan "
        "benchmarks/results/<plan name>-cpu[-quick])",
    )
    parser.add_argument(
        "--collect",
        nargs="+",
        metavar="ROW_JSON",
        help="write the results from row files already measured (--row ... --row-out FILE) instead of running rows",
    )
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--row-out", help=argparse.SUPPRESS)
    parser.add_argument("--invocation", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            OVERRIDES[key] = json.loads(value)
        except json.JSONDecodeError:
            parser.error(f'--set {item!r}: the value must be JSON (false, 2e-4, "linear")')
    from trl_ext.runs.machine import cpu_name

    plan = None
    if args.plan:
        fixed = [
            flag
            for flag, given in (
                ("--set", args.set),
                ("--jobs", args.jobs),
                ("--eval-every", args.eval_every),
                ("--updates", args.updates and not args.row),
                ("--heldout", args.heldout and not args.row),
            )
            if given
        ]
        if fixed:
            parser.error(f"--plan runs the plan as written: {', '.join(fixed)} cannot change it")
        try:
            plan = read_plan(args.plan)
        except (OSError, PlanError) as err:
            parser.error(str(err))
    mode = QUICK if args.quick else FULL
    if plan is not None:
        mode = dict(
            seeds=plan["seeds"][:1] if args.quick else plan["seeds"],
            updates=QUICK["updates"] if args.quick else plan["updates"],
            heldout=QUICK["heldout"] if args.quick else plan["eval_prompts"],
        )
    updates, heldout = args.updates or mode["updates"], args.heldout or mode["heldout"]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else mode["seeds"]

    if args.row:
        if plan is None:
            run_row(
                args.row, seeds[0], updates, heldout, Path(args.row_out), args.eval_every, invocation=args.invocation
            )
        else:
            spec = plan["rows"][args.row]
            run_row(
                args.row,
                seeds[0],
                updates,
                heldout,
                Path(args.row_out),
                kind=spec["kind"],
                settings=spec["settings"],
                split=plan["split"],
                invocation=args.invocation,
            )
        return 0

    known = list(plan["rows"]) if plan else list(ROWS)
    names = [n for n in (args.rows or ",".join(plan["rows"] if plan else PLAIN_ROWS)).split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {known}")
    if plan is not None:
        split_pairs = [pair["rows"] for pair in plan["pairs"] if len(set(pair["rows"]) & set(names)) == 1]
        if split_pairs:
            parser.error(f"--rows with --plan takes whole pairs; {split_pairs} would be split")
        if set(seeds) - set(plan["seeds"]):
            parser.error(f"--seeds with --plan takes some of the plan's seeds {plan['seeds']}")
    jobs_n = plan["jobs"] if plan else (args.jobs or 2)
    name = (Path(plan["path"]).stem if plan else "real-model") + "-cpu" + ("-quick" if args.quick else "")
    stem = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / name
    invocation = new_invocation_id()
    logs = Path(tempfile.mkdtemp(prefix="real-model-rows-"))

    def command_of(name, seed, out):
        python = VENVS / ROWS[plan["rows"][name]["kind"] if plan else name][0] / "bin" / "python"
        common = [
            str(python),
            str(Path(__file__).resolve()),
            "--row",
            name,
            "--row-out",
            str(out),
            "--seeds",
            str(seed),
            "--updates",
            str(updates),
            "--heldout",
            str(heldout),
            "--invocation",
            invocation,
        ]
        if plan is not None:
            return common + ["--plan", plan["path"]]
        return common + [f"--eval-every={args.eval_every}", *(f"--set={item}" for item in args.set)]

    meta = {
        "benchmark": "real-model",
        "quick": args.quick,
        "command": command_line("benchmarks/real_model.py", argv),
        "commit": git_commit(),
        "invocation": None if args.collect else invocation,
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "model": "SmolLM2-135M-Instruct bf16 (trl_ext.tasks.real_model.checkpoint.fetch_smollm2)",
        "settings": {**SETTINGS, **OVERRIDES, "lora_target_modules": "all-linear", "jobs": jobs_n},
        "updates": updates,
        "seeds": seeds,
        "split": plan["split"] if plan else "heldout",
        "held_out_prompts": heldout,
    }
    if plan is not None:
        meta["plan"] = {
            "path": repository_path(plan["path"]),
            "sha256": plan["sha256"],
            "name": plan.get("name"),
            "rows": names,
            "jobs": jobs_n,
        }
        meta["settings"] = {"jobs": jobs_n}  # each row records its own, in full

    def write(results, wall=None):
        rows = [r for r, _ in results if r]
        failed = [f for _, f in results if f]
        if rows and plan is None:
            meta["row_settings"] = row_settings(rows)
        if rows:
            meta["held_out_prompts"] = max(r.get("held_out_prompts", 0) for r in rows)
        meta["wall_seconds"] = wall
        meta["collected_from_row_files"] = bool(args.collect)
        write_outputs(rows, failed, meta, stem, comparisons(rows, plan) if plan else None)
        return rows, failed

    start = time.perf_counter()
    if args.collect:
        results = [(json.loads(Path(f).read_text()), None) for f in args.collect]
    else:
        jobs = plan_jobs(plan, seeds, names) if plan else [(n, s) for n in names for s in seeds]
        print(
            f"invocation {invocation}: {len(jobs)} rows, {jobs_n} at a time; row files and logs in {logs}", flush=True
        )
        # a long plan writes its results after every row: what stopped early still holds the rows that ran
        results = run_jobs(jobs, jobs_n, command_of, logs, on_done=(lambda done: write(done)) if plan else None)
    rows, failed = write(results, None if args.collect else round(time.perf_counter() - start, 1))
    print(f"written {stem}.json/.md/.png: {len(rows)} rows measured, {len(failed)} failed")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
