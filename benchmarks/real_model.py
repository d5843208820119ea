"""PPO and group baselines on the real model: held-out score before and after, on CPU or a GPU.

    OMP_NUM_THREADS=1 python benchmarks/real_model.py --quick     # smoke run: 1 seed, 2 updates, 16 held-out prompts
    OMP_NUM_THREADS=1 python benchmarks/real_model.py             # full: seeds 0 and 1, 20 updates, 200 held-out

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
* ``trl-grpo``     the newest TRL's GRPOTrainer through trl-ext's ``grpo`` runner, 4 generations (``.venv-latest``).

Each row is a subprocess with one torch thread (``--jobs`` side by side). Per row: the held-out score before and
after training (greedy and sampled at T=0.7, ``trl_ext.tasks.real_model.evaluate``), the reward and KL per update and
against seconds, the trainer's ``timing/*`` stats per update (trl-ext's rows; TRL's trainers report none), seconds
per update, and peak memory (``resource.getrusage`` maxrss). Writes benchmarks/results/real-model-cpu.json
(quick: real-model-cpu-quick.json), a .md beside it and a curves .png. Only measured rows are written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = {  # name -> (virtual environment, trl-ext runner, advantage estimator, generations per prompt, settings)
    # Advantages not whitened: over a batch where most answers earn the same score, whitening blows the few
    # failures up to several standard deviations and PPO takes its largest steps there (docs/real-model.md).
    "scratch-ppo": (".venv", "scratch", "gae", 1, {"whiten_advantages": False}),
    "trl-ppo": (".venv", "trl", "gae", 1, {}),
    # No KL term, as TRL's GRPOTrainer at its default beta=0; advantages not divided by the group's std (Dr. GRPO,
    # the GRPO rows' counterpart of the PPO row's unwhitened advantages: docs/real-model.md). With
    # scale_rewards="group" the row is TRL's GRPO per update (tests/test_trl_group_equality.py).
    "scratch-grpo": (".venv", "scratch", "grpo", 4, {"kl_coef": 0.0, "scale_rewards": "none"}),
    "trl-grpo": (".venv-latest", "grpo", "grpo", 4, {"kl_coef": 0.0}),
}
SETTINGS = dict(batch_size=16, learning_rate=1.5e-4, lr_scheduler_type="constant", temperature=0.7,
                response_length=32, num_ppo_epochs=2, value_head_init="zero", lora_r=16, lora_alpha=32,
                dtype="bfloat16", torch_threads=1)
OVERRIDES: dict = {}  # --set: wins over a row's own settings
NOT_CONFIG = ("lora_r", "lora_alpha", "dtype", "torch_threads")  # SETTINGS that are not PPOConfig fields
QUICK = dict(seeds=[0], updates=2, heldout=16)
FULL = dict(seeds=[0, 1], updates=20, heldout=200)


def prompt_dataset(tokenizer, n: int, seed: int):
    import itertools

    from datasets import Dataset

    from trl_ext.tasks.real_model.task import train_stream

    rows = list(itertools.islice(train_stream(seed), n))
    ids = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True) for r in rows]
    ids = [i["input_ids"] if isinstance(i, dict) or hasattr(i, "keys") else i for i in ids]
    return Dataset.from_dict({"prompt": [r["prompt"] for r in rows], "answer": [r["answer"] for r in rows],
                              "input_ids": ids})


def sampled_score(model, tokenizer, rows, seed: int, examples: int = 3) -> dict:
    """The held-out score sampled as the rollouts are (SETTINGS' temperature and length), seeded by ``seed + 1``."""
    from trl_ext.tasks.real_model.evaluate import score_rows

    return score_rows(model, tokenizer, rows, temperature=SETTINGS["temperature"],
                      max_new_tokens=SETTINGS["response_length"], seed=seed + 1, examples=examples)


def held_out(model, tokenizer, rows, seed: int) -> dict:
    from trl_ext.tasks.real_model.evaluate import score_rows

    model.eval()
    greedy = score_rows(model, tokenizer, rows, max_new_tokens=SETTINGS["response_length"], examples=3)
    return {"greedy": greedy, "sampled": sampled_score(model, tokenizer, rows, seed)}


def settings_of(name: str) -> dict:
    """A row's settings: SETTINGS, the row's own over them, ``--set`` over both."""
    return {**SETTINGS, **ROWS[name][4], **OVERRIDES}


def held_out_during(policy, tokenizer, rows, seed: int) -> float:
    """The sampled held-out score in the middle of training, leaving the random state and train mode as they were
    (TRL's trainers sample from torch's global generator: an evaluation must not change their run)."""
    import torch

    cpu, cuda = torch.random.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    training = policy.training
    policy.eval()
    try:
        return sampled_score(policy, tokenizer, rows, seed, examples=0)["score"]
    finally:
        policy.train(training)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def run_row(name: str, seed: int, updates: int, heldout: int, out: Path, eval_every: int = 0) -> None:
    """One row, in this process: train, evaluate before and after, write its JSON to ``out``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.ppo.config import PPOConfig
    from trl_ext.runs.runners import RUNNERS, RunInputs
    from trl_ext.tasks.real_model.checkpoint import fetch_smollm2
    from trl_ext.tasks.real_model.task import JustTheNumber, heldout_rows

    torch.set_num_threads(1)
    _, runner_name, estimator, generations, _ = ROWS[name]
    SETTINGS.update(settings_of(name))
    folder = fetch_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    if torch.cuda.is_available():  # the trainers run on the accelerator's device; evaluate there before as after
        model.to("cuda")
    rows = heldout_rows()[:heldout]
    t0 = time.perf_counter()
    before = held_out(model, tokenizer, rows, seed)
    eval_before_s = time.perf_counter() - t0

    lora = LoraConfig(task_type="CAUSAL_LM", r=SETTINGS["lora_r"], lora_alpha=SETTINGS["lora_alpha"],
                      lora_dropout=0.0, target_modules="all-linear")
    work = tempfile.mkdtemp(prefix=f"real-model-{name}-")
    fields = {k: v for k, v in SETTINGS.items() if k not in NOT_CONFIG}
    cfg = PPOConfig(output_dir=work, total_episodes=updates * SETTINGS["batch_size"], seed=seed,
                    advantage_estimator=estimator, num_generations=generations, **fields)
    policy, peft_config = model, lora
    if runner_name in ("grpo", "rloo"):  # trl-ext's group runners take a ready policy: the adapter goes on here
        policy, peft_config = get_peft_model(model, lora), None
    inputs = RunInputs(cfg, policy, tokenizer, JustTheNumber(), prompts=lambda n: prompt_dataset(tokenizer, n, seed),
                       peft_config=peft_config)
    runner = RUNNERS[runner_name](inputs)
    curve = []
    evaluating = [0.0]  # seconds spent on held-out scores during training: not training time
    start = time.perf_counter()

    def on_update(update, stats) -> bool:
        curve.append({"update": int(update), "seconds": round(time.perf_counter() - start - evaluating[0], 2),
                      "reward": float(stats["objective/scores"]),
                      "kl": round(float(stats.get("objective/kl", "nan")), 4),
                      **{metric: round(float(stats[key]), 4) for metric, key in (("approxkl", "policy/approxkl_avg"),
                                                                                 ("clipfrac", "policy/clipfrac_avg"))
                         if key in stats},
                      **{k: round(float(v), 4) for k, v in stats.items() if k.startswith("timing/")}})
        if eval_every and int(update) % eval_every == 0 and int(update) < updates:
            t0 = time.perf_counter()
            curve[-1]["held_out"] = held_out_during(runner.policy, tokenizer, rows, seed)
            evaluating[0] += time.perf_counter() - t0
        print(f"[{name} seed {seed}] update {update} reward {curve[-1]['reward']:.3f} held-out "
              f"{curve[-1].get('held_out', '-')} at {curve[-1]['seconds']} s", flush=True)
        return False

    runner.train(on_update)
    train_s = time.perf_counter() - start - evaluating[0]
    t0 = time.perf_counter()
    after = held_out(runner.policy, tokenizer, rows, seed)
    eval_after_s = time.perf_counter() - t0
    phases = sorted({k for c in curve for k in c if k.startswith("timing/") and k != "timing/elapsed"})
    import trl

    row = {
        "trainer": name, "runner": runner_name, "advantage_estimator": estimator, "num_generations": generations,
        "seed": seed, "updates": len(curve), "episodes": len(curve) * SETTINGS["batch_size"],
        "held_out_prompts": len(rows),
        # The KL logged at update 1, before any step, while the policy equals its reference (LoRA's B = 0): about 0
        # unless the rollout's log-probs and the reference's disagree (6-12 nats in TRL's row after right padding)
        "update1_kl": next((c["kl"] for c in curve if c["update"] == 1), None),
        "before": before["sampled"]["score"], "after": after["sampled"]["score"],
        "before_greedy": before["greedy"]["score"], "after_greedy": after["greedy"]["score"],
        "before_detail": before, "after_detail": after,
        "train_seconds": round(train_s, 1), "seconds_per_update": round(train_s / max(1, len(curve)), 2),
        "seconds_per_update_by_phase": {p: round(sum(c.get(p, 0.0) for c in curve) / len(curve), 3) for p in phases},
        "eval_seconds": {"before": round(eval_before_s, 1), "after": round(eval_after_s, 1),
                         "during": round(evaluating[0], 1)},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "settings": dict(SETTINGS), "curve": curve, "python": sys.executable, "trl": trl.__version__, "torch": torch.__version__,
    }
    out.write_text(json.dumps(row, indent=2, ensure_ascii=False) + "\n")


def row_settings(rows: list[dict]) -> dict:
    """Per trainer, the settings its rows ran with that differ from SETTINGS (as each row recorded them)."""
    changed = {}
    for r in rows:
        if "settings" in r:
            changed.setdefault(r["trainer"], {}).update(
                {k: v for k, v in r["settings"].items() if k not in SETTINGS or SETTINGS[k] != v})
    return changed


def write_outputs(rows: list[dict], failed: list[dict], meta: dict, stem: Path) -> None:
    stem.with_suffix(".json").write_text(json.dumps(dict(meta, rows=rows, failed=failed), indent=2,
                                                    ensure_ascii=False) + "\n")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from real_model_tables import results_table

    data = json.loads(stem.with_suffix(".json").read_text())
    stem.with_suffix(".md").write_text(results_table(data, stem.with_suffix(".json").name, f"`{meta['command']}`")
                                       + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
        colour = {name: f"C{i}" for i, name in enumerate(ROWS)}  # one colour a trainer, one line a seed
        for r in rows:
            c, label = colour.get(r["trainer"], "k"), r["trainer"]
            a.plot([x["update"] for x in r["curve"]], [x["reward"] for x in r["curve"]], color=c, alpha=0.6,
                   marker=".", label=label)
            b.plot([x["seconds"] for x in r["curve"]], [x["reward"] for x in r["curve"]], color=c, alpha=0.6,
                   marker=".", label=label)
            held = [(0, r["before"])] + [(x["update"], x["held_out"]) for x in r["curve"] if "held_out" in x] \
                + [(r["curve"][-1]["update"], r["after"])]
            if len(held) > 2:  # --eval-every: the held-out score along the run, dashed in the trainer's colour
                a.plot(*zip(*held), linestyle="--", marker="x", color=c, label=f"{label} held-out")
        a.set_xlabel("update"), b.set_xlabel("seconds of training"), a.set_ylabel("mean training reward")
        handles = dict(zip(*reversed(a.get_legend_handles_labels())))  # one entry a label, every seed drawn
        fig.legend(handles.values(), handles.keys(), loc="center right", fontsize=8)
        fig.subplots_adjust(right=0.8)
        fig.suptitle(f"{stem.name}: every seed a line; held-out dashed where measured along the run")
        fig.savefig(stem.with_suffix(".png"), dpi=100)
    except ImportError as err:
        print(f"no curves PNG: {err}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 updates, the first 16 held-out prompts")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of " + ", ".join(ROWS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--updates", type=int)
    parser.add_argument("--seeds", help="comma-separated")
    parser.add_argument("--heldout", type=int)
    parser.add_argument("--eval-every", type=int, default=0, metavar="N",
                        help="also score the held-out set (sampled) after every N-th update, into the curves")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                        help="override one of SETTINGS for every row, e.g. --set whiten_advantages=false (repeatable)")
    parser.add_argument("--out", help="results stem (default benchmarks/results/real-model-cpu[-quick])")
    parser.add_argument("--collect", nargs="+", metavar="ROW_JSON",
                        help="write the results from row files already measured (--row ... --row-out FILE) instead "
                             "of running rows")
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--row-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            OVERRIDES[key] = json.loads(value)
        except json.JSONDecodeError:
            parser.error(f"--set {item!r}: the value must be JSON (false, 2e-4, \"linear\")")
    mode = QUICK if args.quick else FULL
    updates, heldout = args.updates or mode["updates"], args.heldout or mode["heldout"]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else mode["seeds"]
    sys.path.insert(0, str(ROOT))
    from trl_ext.runs.machine import cpu_name

    if args.row:
        run_row(args.row, seeds[0], updates, heldout, Path(args.row_out), args.eval_every)
        return 0

    names = [n for n in args.rows.split(",") if n]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {list(ROWS)}")
    stem = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / (
        "real-model-cpu-quick" if args.quick else "real-model-cpu")
    logs = Path(tempfile.mkdtemp(prefix="real-model-rows-"))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(ROOT))

    def one(job):
        name, seed = job
        out = logs / f"{name}-{seed}.json"
        cmd = [str(ROOT / ROWS[name][0] / "bin" / "python"), str(Path(__file__).resolve()), "--row", name,
               "--row-out", str(out), "--seeds", str(seed), "--updates", str(updates), "--heldout", str(heldout),
               f"--eval-every={args.eval_every}", *(f"--set={item}" for item in args.set)]
        t0 = time.perf_counter()
        with open(logs / f"{name}-{seed}.log", "w") as log:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
        print(f"{name} seed {seed}: exit {rc} after {time.perf_counter() - t0:.0f} s (log {logs}/{name}-{seed}.log)",
              flush=True)
        if rc == 0 and out.exists():
            return json.loads(out.read_text()), None
        tail = (logs / f"{name}-{seed}.log").read_text().strip().splitlines()[-1:] or [""]
        return None, {"trainer": name, "seed": seed, "returncode": rc, "error": tail[0][-300:]}

    start = time.perf_counter()
    if args.collect:
        results = [(json.loads(Path(f).read_text()), None) for f in args.collect]
    else:
        jobs = [(n, s) for n in names for s in seeds]  # with --jobs 2, a row's two seeds side by side
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(one, jobs))
    rows = [r for r, _ in results if r]
    failed = [f for _, f in results if f]
    meta = {"benchmark": "real-model", "quick": args.quick,
            "command": "OMP_NUM_THREADS=1 python benchmarks/real_model.py " + " ".join(argv or sys.argv[1:]),
            "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version()},
            "model": "SmolLM2-135M-Instruct bf16 (trl_ext.tasks.real_model.checkpoint.fetch_smollm2)",
            "settings": {**SETTINGS, **OVERRIDES, "lora_target_modules": "all-linear", "jobs": args.jobs},
            "row_settings": row_settings(rows),
            "updates": updates, "seeds": seeds, "held_out_prompts": heldout,
            "wall_seconds": None if args.collect else round(time.perf_counter() - start, 1),
            "collected_from_row_files": bool(args.collect)}
    write_outputs(rows, failed, meta, stem)
    print(f"written {stem}.json/.md/.png: {len(rows)} rows measured, {len(failed)} failed")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
