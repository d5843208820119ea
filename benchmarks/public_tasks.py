"""Public tasks (issue 52 item 4): where two real models start on reasoning-gym tasks, and PPO and GRPO trained there.

The plan, committed before anything ran: benchmarks/public_tasks_plan.md (its sections are cited below).

    OMP_NUM_THREADS=1 python benchmarks/public_tasks.py --base-panel            # section 1: both models, 8 tasks
    OMP_NUM_THREADS=1 python benchmarks/public_tasks.py --select                # section 2: settings by measurement
    OMP_NUM_THREADS=1 python benchmarks/public_tasks.py --select --answer-format last-number --tokens 64   # 2b
    OMP_NUM_THREADS=1 python benchmarks/public_tasks.py --cost                  # section 4: 0.5B beside SmolLM2
    OMP_NUM_THREADS=1 python benchmarks/public_tasks.py --train --tasks A,B     # section 3: ppo, grpo, trl-grpo
    OMP_NUM_THREADS=1 python benchmarks/public_tasks.py --train --quick --tasks basic_arithmetic   # smoke run

``--models`` takes catalogue names (``trl_ext.models.catalogue``, fetched by ``fetch_model``) or checkpoint folders.
Scores are ``ReasoningGymReward``'s: the answer as the rows' answer format reads it (reasoning-gym's
``extract_answer``, the last ``<answer>...</answer>``, or the last number: ``--answer-format``) and the task's
``score_answer``. Training rows are subprocesses (one torch thread each, one at a time by default), each in
its trainer's virtual environment (``.venv``; TRL's GRPOTrainer in ``.venv-latest``, the newest TRL; the folder
``TRL_EXT_VENVS`` names, else this checkout); every row records the invocation's id. A row's training prompts ask
none of its test prompts' questions (``trl_ext.data.reasoning_gym_splits.train_excluding``): the row records
``test_overlap`` (0) and the setting's estimated ``distinct_questions``. Writes
``benchmarks/results/public-tasks-<mode>-cpu[-quick].json`` with ``base_panel`` and ``rows``, the command and the
machine, and its table beside it (``public_tasks_tables.py``).
"""

from __future__ import annotations

import argparse
import json
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
    command_line,
    file_record,
    merge_invocations,
    new_invocation_id,
    run_jobs,
    write_results,
)

RESULTS = ROOT / "benchmarks" / "results"
PLAN = ROOT / "benchmarks" / "public_tasks_plan.md"
MODELS = ("SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct")
PANEL = (
    "basic_arithmetic",
    "chain_sum",
    "leg_counting",
    "gsm_symbolic",
    "letter_counting",
    "spell_backward",
    "number_sorting",
    "coin_flip",
)
PANEL_PROMPTS = {"SmolLM2-135M-Instruct": 16, "Qwen2.5-Coder-0.5B-Instruct": 8}  # others (a folder): 16
PANEL_TOKENS, TEMPERATURE, SAMPLE_SEED = 128, 0.7, 1
QUALIFY = (0.05, 0.6)  # section 2: SmolLM2's sampled score that gives RL something to start from
# Section 2's candidates when fewer than 2 tasks qualify at the defaults: formats x difficulties, on a train stream
SELECT_PROMPTS = ("default", "simple", "direct")
SELECT_SEED = 1000
EASY = {
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "max_digits": 1,
        "operators": "+-",
        "allow_parentheses": False,
        "allow_negation": False,
    },
    "chain_sum": {"min_terms": 2, "max_terms": 2, "max_digits": 1},
    "leg_counting": {"min_animals": 1, "max_animals": 1, "max_instances": 3},
    "number_sorting": {"min_numbers": 3, "max_numbers": 3, "max_decimals": 0},
    "letter_counting": {"min_words": 3, "max_words": 3},
}
# Section 2b (the amendment): the tasks whose answers are numbers, for the "last-number" answer format
NUMERIC = ("basic_arithmetic", "chain_sum", "leg_counting", "gsm_symbolic", "letter_counting", "coin_flip")
# Section 3: name -> (virtual environment, trl-ext runner, advantage estimator, generations a prompt)
ROWS = {
    "ppo": (".venv", "scratch", "gae", 1),
    "grpo": (".venv", "scratch", "grpo", 4),
    "trl-grpo": (".venv-latest", "grpo", "grpo", 4),
    "ppo-critic-adapter": (".venv", "scratch", "gae", 1),  # amendment 2c (issue 51): the critic a second adapter
    "ppo-combination": (".venv", "scratch", "gae", 1),  # issue 51's candidate (critic_ablation_plan.md, amendment 9)
}
# What a row sets beyond SETTINGS (amendment 2c; the candidate's two techniques as on the number task)
ROW_SETTINGS = {
    "ppo-critic-adapter": {"critic_adapter": True},
    "ppo-combination": {"critic_lam": 1.0, "positive_lm_coef": 0.1, "positive_lm_threshold": 0.5},
}
SETTINGS = dict(
    batch_size=16,
    learning_rate=1.5e-4,
    lr_scheduler_type="constant",
    num_ppo_epochs=2,
    temperature=0.7,
    response_length=128,
    kl_coef=0.0,
    beta=0.0,
    cliprange=0.2,
    scale_rewards="group",
    whiten_advantages=False,
    value_head_init="zero",
)
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")
SEEDS, UPDATES, EVAL_PROMPTS = [11, 12, 13], 40, 64
COST = dict(task="basic_arithmetic", updates=3, batch_size=4, response_length=64, trainer="ppo")
QUICK = dict(seeds=[11], updates=2, eval_prompts=4, panel_prompts=4, tokens=16)


def model_label(model: str) -> str:
    return Path(model).name if Path(model).exists() else model


def model_folder(model: str) -> Path:
    """A checkpoint folder as given, or the catalogue model's converted checkpoint (reused from the cache)."""
    if Path(model).is_dir():
        return Path(model)
    from trl_ext.models.fetch import fetch_model

    return fetch_model(model)


def load(model: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = model_folder(model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    policy = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    if torch.cuda.is_available():
        policy.to("cuda")
    policy.eval()
    return policy, tokenizer


# ---------------------------------------------------------------------------------------- scoring


def is_tagged(text: str, answer_format: str = "tags") -> bool:
    """An answer the format can read: a complete ``<answer>...</answer>`` pair (what reasoning-gym's
    ``extract_answer`` reads), or for ``"last-number"`` a number anywhere in the reply."""
    from reasoning_gym.utils import extract_answer

    from trl_ext.data.reasoning_gym import last_number

    return (extract_answer(text) if answer_format == "tags" else last_number(text)) is not None


def score(
    model, tokenizer, dataset, *, temperature: float, max_new_tokens: int, seed: int = SAMPLE_SEED, examples: int = 2
) -> dict:
    """Mean ``ReasoningGymReward`` over ``dataset``'s rows, one completion each (greedy at temperature 0), how many
    answers carried the answer tags and how many were right, and a few completions."""
    from trl_ext.models.chat_completions import generate
    from trl_ext.rewards.reasoning_gym import ReasoningGymReward

    t0 = time.perf_counter()
    prompts = list(dataset["prompt"])
    texts = generate(
        model,
        tokenizer,
        prompts,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        batch_size=len(prompts),
        seed=seed,
    )
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    scores = ReasoningGymReward()(
        prompts,
        completions,
        task=list(dataset["task"]),
        task_config=list(dataset["task_config"]),
        entry=list(dataset["entry"]),
        answer_format=list(dataset["answer_format"]),
    )
    n, answer_format = len(scores), dataset["answer_format"][0]
    return {
        "score": round(sum(scores) / n, 4),
        "answers": n,
        "tagged": sum(is_tagged(t, answer_format) for t in texts),
        "right": sum(s == 1.0 for s in scores),
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "seconds": round(time.perf_counter() - t0, 1),
        "examples": [{"completion": texts[i], "reward": scores[i]} for i in range(min(examples, n))],
    }


def both_modes(model, tokenizer, dataset, max_new_tokens: int, seed: int = SAMPLE_SEED) -> dict:
    return {
        "greedy": score(model, tokenizer, dataset, temperature=0.0, max_new_tokens=max_new_tokens),
        "sampled": score(model, tokenizer, dataset, temperature=TEMPERATURE, max_new_tokens=max_new_tokens, seed=seed),
    }


def base_panel(models: list[str], tasks: list[str], prompts: int | None, tokens: int) -> dict:
    """Section 1: per model, per task, greedy and sampled on the test stream of seed 0."""
    from trl_ext.data.reasoning_gym import reasoning_gym_dataset

    panel = {}
    for name in models:
        t0 = time.perf_counter()
        model, tokenizer = load(name)
        n = prompts or PANEL_PROMPTS.get(name, 16)
        per_task = {}
        for task in tasks:
            data = reasoning_gym_dataset(task, size=n, seed=0, split="test")
            per_task[task] = both_modes(model, tokenizer, data, tokens)
            print(
                f"[{model_label(name)}] {task}: greedy {per_task[task]['greedy']['score']:.3f} "
                f"({per_task[task]['greedy']['tagged']}/{n} tagged), sampled {per_task[task]['sampled']['score']:.3f} "
                f"({per_task[task]['sampled']['tagged']}/{n} tagged)",
                flush=True,
            )
        panel[model_label(name)] = {
            "prompts": n,
            "max_new_tokens": tokens,
            "split": "test",
            "stream_seed": 0,
            "system_prompt": "default",
            "tasks": per_task,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        del model
    return panel


def qualifying(panel: dict, model: str = MODELS[0]) -> list[str]:
    """Section 2, step 1: the tasks whose sampled score lies in QUALIFY, closest to 0.3 first."""
    tasks = panel.get(model, {}).get("tasks", {})
    found = [t for t, r in tasks.items() if QUALIFY[0] <= r["sampled"]["score"] <= QUALIFY[1]]
    return sorted(found, key=lambda t: (abs(tasks[t]["sampled"]["score"] - 0.3), list(tasks).index(t)))


def select(model_name: str, tasks: list[str], prompts: int, tokens: int, answer_format: str = "tags") -> list[dict]:
    """Section 2, step 2: each candidate (task x system prompt x difficulty), sampled on a train stream; with
    ``answer_format="last-number"`` (section 2b) the format's own system prompt replaces reasoning-gym's three."""
    from trl_ext.data.reasoning_gym import DEFAULT_SYSTEM_PROMPT, reasoning_gym_dataset

    model, tokenizer = load(model_name)
    found = []
    system_prompts = SELECT_PROMPTS if answer_format == "tags" else (DEFAULT_SYSTEM_PROMPT,)
    for task in tasks:
        for system_prompt in system_prompts:
            for difficulty, config in (("default", {}), *((("easy", EASY[task]),) if task in EASY else ())):
                data = reasoning_gym_dataset(
                    task,
                    size=prompts,
                    seed=SELECT_SEED,
                    split="train",
                    system_prompt=system_prompt,
                    task_configs={task: config} if config else None,
                    answer_format=answer_format,
                )
                result = score(model, tokenizer, data, temperature=TEMPERATURE, max_new_tokens=tokens)
                found.append(
                    {
                        "model": model_label(model_name),
                        "task": task,
                        "answer_format": answer_format,
                        "max_new_tokens": tokens,
                        "system_prompt": system_prompt,
                        "difficulty": difficulty,
                        "task_config": config,
                        "sampled": result,
                    }
                )
                print(
                    f"[select] {task} {answer_format} {system_prompt} {difficulty}: {result['score']:.3f} "
                    f"({result['tagged']}/{prompts} tagged)",
                    flush=True,
                )
    return found


def chosen(candidates: list[dict]) -> list[dict]:
    """The best two candidates on distinct tasks, closest to 0.3 within QUALIFY (else closest to the band)."""

    def distance(c):
        s = c["sampled"]["score"]
        return (0 if QUALIFY[0] <= s <= QUALIFY[1] else 1, abs(s - 0.3))

    picked, seen = [], set()
    for c in sorted(candidates, key=distance):
        if c["task"] not in seen:
            picked.append(dict(c, qualifies=distance(c)[0] == 0))
            seen.add(c["task"])
        if len(picked) == 2:
            break
    return picked


# ---------------------------------------------------------------------------------------- training rows


def prompt_dataset(tokenizer, spec: dict, n: int, seed: int, held=None):
    """``n`` rows of the row's task's train stream, none asking a question of ``held`` (the test rows), with
    ``input_ids`` (what trl-ext's trainer reads) beside the reward's columns."""
    data = task_dataset(spec, n, seed, "train", exclude=held)
    ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True) for p in data["prompt"]]
    ids = [i["input_ids"] if hasattr(i, "keys") else i for i in ids]
    return data.add_column("input_ids", ids)


def configs_of(spec: dict) -> dict | None:
    return {spec["task"]: spec["task_config"]} if spec["task_config"] else None


def task_dataset(spec: dict, n: int, seed: int, split: str, exclude=None):
    """``n`` rows of the row's task at its system prompt, config and answer format; given ``exclude`` (test rows), a
    train stream that asks none of their questions (``train_excluding``)."""
    from trl_ext.data.reasoning_gym import reasoning_gym_dataset
    from trl_ext.data.reasoning_gym_splits import train_excluding

    settings = dict(
        system_prompt=spec["system_prompt"],
        task_configs=configs_of(spec),
        answer_format=spec.get("answer_format", "tags"),
    )
    if exclude is not None and split == "train":
        return train_excluding(spec["task"], n, exclude, seed=seed, **settings)
    return reasoning_gym_dataset(spec["task"], size=n, seed=seed, split=split, **settings)


def run_row(spec: dict, out: Path) -> None:
    """One row in this process: evaluate before, train, evaluate after, write its JSON to ``out``."""
    import torch
    from peft import LoraConfig, get_peft_model

    from trl_ext.data.reasoning_gym_splits import distinct_questions, question_overlap
    from trl_ext.ppo.config import PPOConfig
    from trl_ext.rewards.reasoning_gym import ReasoningGymReward
    from trl_ext.runs.runners import RUNNERS, RunInputs

    torch.set_num_threads(1)
    _, runner_name, estimator, generations = ROWS[spec["trainer"]]
    settings, task, seed = spec["settings"], spec["task"], spec["seed"]
    model, tokenizer = load(spec["model"])
    held = task_dataset(spec, spec["eval_prompts"], 0, "test")
    t0 = time.perf_counter()
    before = both_modes(model, tokenizer, held, settings["response_length"], seed=seed) if spec["evaluate"] else None
    eval_before = time.perf_counter() - t0
    work = tempfile.mkdtemp(prefix=f"public-tasks-{spec['trainer']}-")
    cfg = PPOConfig(
        output_dir=work,
        total_episodes=spec["updates"] * settings["batch_size"],
        seed=seed,
        advantage_estimator=estimator,
        num_generations=generations,
        **settings,
        **ROW_SETTINGS.get(spec["trainer"], {}),
    )
    lora = LoraConfig(task_type="CAUSAL_LM", **LORA)
    model.train()
    policy, peft_config = (get_peft_model(model, lora), None) if runner_name == "grpo" else (model, lora)
    stream = seed * 100_000  # section 3: the seeds' train streams do not overlap
    trained = {}  # the train rows the runner asks for (once): their overlap with the test rows is recorded

    def prompts(n: int):
        trained["rows"] = prompt_dataset(tokenizer, spec, n, stream, held)  # none of the test rows' questions
        return trained["rows"]

    inputs = RunInputs(cfg, policy, tokenizer, ReasoningGymReward(), prompts=prompts, peft_config=peft_config)
    runner = RUNNERS[runner_name](inputs)
    curve, start = [], time.perf_counter()

    def on_update(update, stats) -> bool:
        curve.append(
            {
                "update": int(update),
                "seconds": round(time.perf_counter() - start, 2),
                "reward": round(float(stats["objective/scores"]), 4),
                **{k: round(float(v), 3) for k, v in stats.items() if k.startswith("timing/")},
            }
        )
        print(
            f"[{spec['trainer']} {task} seed {seed}] update {update} reward {curve[-1]['reward']:.3f} at "
            f"{curve[-1]['seconds']} s",
            flush=True,
        )
        return False

    runner.train(on_update)
    train_s = time.perf_counter() - start
    runner.policy.eval()
    t0 = time.perf_counter()
    after = (
        both_modes(runner.policy, tokenizer, held, settings["response_length"], seed=seed) if spec["evaluate"] else None
    )
    import trl

    row = {
        "model": model_label(spec["model"]),
        "task": task,
        "trainer": spec["trainer"],
        "estimator": estimator,
        "seed": seed,
        "invocation": spec["invocation"],
        "runner": runner_name,
        "system_prompt": spec["system_prompt"],
        "task_config": spec["task_config"],
        "answer_format": spec.get("answer_format", "tags"),
        "updates": len(curve),
        "episodes": len(curve) * settings["batch_size"],
        "split": "test",
        "eval_prompts": spec["eval_prompts"],
        "test_overlap": question_overlap(trained["rows"], held),  # test rows whose question training asked: 0
        "distinct_questions": distinct_questions(task, configs_of(spec)).estimate,
        "before": before and before["sampled"]["score"],
        "after": after and after["sampled"]["score"],
        "before_greedy": before and before["greedy"]["score"],
        "after_greedy": after and after["greedy"]["score"],
        "before_detail": before,
        "after_detail": after,
        "train_seconds": round(train_s, 1),
        "seconds_per_update": round(train_s / max(1, len(curve)), 2),
        "eval_seconds": {"before": round(eval_before, 1), "after": round(time.perf_counter() - t0, 1)},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "settings": dict(
            settings,
            advantage_estimator=estimator,
            num_generations=generations,
            lora=LORA,
            **ROW_SETTINGS.get(spec["trainer"], {}),
        ),
        "curve": curve,
        "python": sys.executable,
        "trl": trl.__version__,
        "torch": torch.__version__,
    }
    out.write_text(json.dumps(row, indent=2, ensure_ascii=False) + "\n")


def row_command(spec: dict, out: Path) -> list[str]:
    """The argv of one row's subprocess, in its trainer's venv; its spec written beside ``out``."""
    spec_file = out.with_suffix(".spec.json")
    spec_file.write_text(json.dumps(spec))
    python = VENVS / ROWS[spec["trainer"]][0] / "bin" / "python"
    return [str(python), str(Path(__file__).resolve()), "--row", str(spec_file), "--row-out", str(out)]


def run_rows(specs: list[dict], jobs: int, on_done) -> tuple[list[dict], list[dict]]:
    """Each spec as a row subprocess, ``jobs`` at a time (the harness's ``run_jobs``): the rows and the failures."""
    logs = Path(tempfile.mkdtemp(prefix="public-tasks-rows-"))
    print(f"{len(specs)} rows, {jobs} at a time; row files and logs in {logs}", flush=True)
    by_job = {(f"{s['trainer']}-{s['task']}-{model_label(s['model'])}", s["seed"]): s for s in specs}

    def split(results):
        rows = [row for row, _ in results if row]
        failed = [
            {
                **{k: by_job[job][k] for k in ("task", "trainer", "seed")},
                "model": model_label(by_job[job]["model"]),  # as its row names it: a rerun's row matches it
                **{k: f[k] for k in ("returncode", "error")},
            }
            for job, (_, f) in zip(by_job, results)
            if f
        ]
        return rows, failed

    results = run_jobs(
        list(by_job),
        jobs,
        lambda name, seed, out: row_command(by_job[(name, seed)], out),
        logs,
        on_done=lambda done: on_done(*split(done)),
    )
    return split(results)


# What a row's task and trainer ran at: the same in every invocation of one run (its seed and seconds may differ)
ROW_GROUND = ("model", "system_prompt", "task_config", "answer_format", "updates", "split", "eval_prompts", "settings")


def row_identity(row: dict) -> tuple:
    return row.get("model"), row["task"], row["trainer"], row["seed"]


def merge_results(results: list[dict], command: str) -> dict:
    """One --train result from several invocations (a run a seed an invocation): ``harness.merge_invocations``,
    refused where a result is not --train's or a task's trainer ran at other settings in another invocation."""
    modes = sorted({str(result.get("mode")) for result in results} - {"train"})
    if modes:
        raise ValueError(f"--merge takes --train results only, not {modes}")
    ran_at: dict[tuple, dict] = {}
    for row in (r for result in results for r in result["rows"]):
        mine = {k: row.get(k) for k in ROW_GROUND}
        if ran_at.setdefault((row["task"], row["trainer"]), mine) != mine:
            raise ValueError(f"{row['trainer']} on {row['task']} ran at other settings in another invocation")
    merged = merge_invocations(results, command, ("benchmark", "mode", "quick"), row_identity)
    # rows an older invocation left out (they name no model): dropped where another invocation measured them
    measured = {row_identity(r)[1:] for r in merged["rows"]}
    merged["not_run"] = [
        r for result in results for r in result.get("not_run", []) if row_identity(r)[1:] not in measured
    ]
    return merged


# ---------------------------------------------------------------------------------------- main


def write_results_and_table(stem: Path, data: dict) -> None:
    from benchmarks.public_tasks_tables import results_table

    json_path = stem.with_suffix(".json")
    write_results(json_path, data, lambda written: results_table(written, json_path.name))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--base-panel", action="store_true", help="section 1: each model on the panel's test streams")
    mode.add_argument(
        "--select", action="store_true", help="section 2: formats and difficulties, SmolLM2, train stream"
    )
    mode.add_argument("--train", action="store_true", help="section 3: ppo, grpo and trl-grpo on --tasks")
    mode.add_argument("--cost", action="store_true", help="section 4: the 0.5B model beside SmolLM2, 3 updates")
    parser.add_argument(
        "--models", help="comma-separated catalogue names or checkpoint folders (default: both; --train: SmolLM2)"
    )
    parser.add_argument("--tasks", help="comma-separated reasoning-gym tasks (default: the panel's 8)")
    parser.add_argument(
        "--task-setting",
        action="append",
        default=[],
        metavar="TASK=JSON",
        help="--train: a task's system prompt, config and answer format from --select, e.g. "
        'chain_sum=\'{"system_prompt": "simple", "task_config": {"max_terms": 2}, "answer_format": "tags"}\'',
    )
    parser.add_argument(
        "--answer-format",
        default="tags",
        choices=("tags", "last-number"),
        help="--select: the answer format (last-number: section 2b, the tasks whose answers are numbers)",
    )
    parser.add_argument(
        "--tokens", type=int, help=f"--select/--train: new tokens a reply (default {PANEL_TOKENS}; --quick: 16)"
    )
    parser.add_argument("--rows", help="--train: comma-separated, of " + ", ".join(ROWS))
    parser.add_argument("--jobs", type=int, default=1, help="--train/--cost: rows at a time (one torch thread each)")
    parser.add_argument("--seeds", help=f"--train: comma-separated (default {SEEDS})")
    parser.add_argument("--updates", type=int, help=f"--train: updates of {SETTINGS['batch_size']} (default {UPDATES})")
    parser.add_argument("--eval-prompts", type=int, help=f"--train: test prompts (default {EVAL_PROMPTS})")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 2 updates, 4 prompts, 16 tokens")
    parser.add_argument("--out", help="results stem (default benchmarks/results/public-tasks-<mode>-cpu[-quick])")
    parser.add_argument(
        "--plan", type=Path, default=PLAN, help="the plan this run follows, its hash recorded (default: section 3's)"
    )
    parser.add_argument(
        "--merge", nargs="+", metavar="JSON", help="--train results of one run's invocations, as one (needs --out)"
    )
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--row-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.merge:
        if not args.out:
            parser.error("--merge needs --out")
        try:
            merged = merge_results(
                [json.loads(Path(f).read_text()) for f in args.merge], command_line("benchmarks/public_tasks.py", argv)
            )
        except (ValueError, OSError) as err:
            parser.error(str(err))
        write_results_and_table(Path(args.out), merged)
        return 0
    if args.row:
        run_row(json.loads(Path(args.row).read_text()), Path(args.row_out))
        return 0
    if not (args.base_panel or args.select or args.train or args.cost):
        parser.error("one of --base-panel, --select, --train, --cost")
    if not args.plan.is_file():
        parser.error(f"--plan {args.plan}: no such file")
    from trl_ext.runs.machine import cpu_name, device_tag, machine

    info = dict(machine(), cpu=cpu_name())
    default_tasks = NUMERIC if args.answer_format == "last-number" else PANEL
    tasks = args.tasks.split(",") if args.tasks else list(default_tasks)
    name = "base" if args.base_panel else "select" if args.select else "train" if args.train else "cost"
    stem = Path(args.out) if args.out else RESULTS / f"public-tasks-{name}-{device_tag(info)}{'-quick' * args.quick}"
    invocation = new_invocation_id()
    command = command_line("benchmarks/public_tasks.py", argv)
    data = {
        "benchmark": "public-tasks",
        "mode": name,
        "quick": args.quick,
        "command": command,
        "invocation": invocation,
        "plan": file_record(args.plan),
        "machine": info,
        "jobs": args.jobs,
        "base_panel": {},
        "rows": [],
        "failed": [],
    }
    tokens = args.tokens or (QUICK["tokens"] if args.quick else PANEL_TOKENS)
    start = time.perf_counter()
    if args.base_panel:
        models = args.models.split(",") if args.models else list(MODELS)
        data["base_panel"] = base_panel(models, tasks, QUICK["panel_prompts"] if args.quick else None, tokens)
        data["qualifying"] = qualifying(data["base_panel"], model_label(models[0]))
    elif args.select:
        model = args.models.split(",")[0] if args.models else MODELS[0]
        prompts = QUICK["panel_prompts"] if args.quick else 16
        data["candidates"] = select(model, tasks, prompts, tokens, args.answer_format)
        data["chosen"] = chosen(data["candidates"])
    else:
        if args.train:
            models = args.models.split(",")[:1] if args.models else [MODELS[0]]
            trainers = args.rows.split(",") if args.rows else list(ROWS)
            unknown = [t for t in trainers if t not in ROWS]
            if unknown:
                parser.error(f"unknown rows {unknown}; known: {list(ROWS)}")
            seeds = (
                [int(s) for s in args.seeds.split(",")]
                if args.seeds
                else (QUICK if args.quick else {"seeds": SEEDS})["seeds"]
            )
            updates = args.updates or (QUICK["updates"] if args.quick else UPDATES)
            overrides = {}
            for item in args.task_setting:
                task, _, value = item.partition("=")
                overrides[task] = json.loads(value)
            settings = dict(SETTINGS, response_length=tokens)
            specs = [
                dict(
                    model=models[0],
                    task=task,
                    trainer=trainer,
                    seed=seed,
                    updates=updates,
                    evaluate=True,
                    eval_prompts=args.eval_prompts or (QUICK["eval_prompts"] if args.quick else EVAL_PROMPTS),
                    system_prompt=overrides.get(task, {}).get("system_prompt", "default"),
                    task_config=overrides.get(task, {}).get("task_config", {}),
                    answer_format=overrides.get(task, {}).get("answer_format", "tags"),
                    settings=settings,
                    invocation=invocation,
                )
                for seed in seeds
                for task in tasks
                for trainer in trainers
            ]
        else:  # cost: the same shapes for each model, one after the other
            models = args.models.split(",") if args.models else list(MODELS)
            settings = dict(
                SETTINGS,
                batch_size=COST["batch_size"],
                response_length=QUICK["tokens"] if args.quick else COST["response_length"],
            )
            specs = [
                dict(
                    model=m,
                    task=args.tasks or COST["task"],
                    trainer=COST["trainer"],
                    seed=0,
                    updates=args.updates or (1 if args.quick else COST["updates"]),
                    evaluate=False,
                    eval_prompts=1,
                    system_prompt="default",
                    task_config={},
                    settings=settings,
                    invocation=invocation,
                )
                for m in models
            ]

        def on_done(rows, failed):
            data.update(rows=rows, failed=failed, wall_seconds=round(time.perf_counter() - start, 1))
            write_results_and_table(stem, data)

        run_rows(specs, args.jobs, on_done)
    data["wall_seconds"] = round(time.perf_counter() - start, 1)
    write_results_and_table(stem, data)
    print(f"written {stem}.json/.md ({data['wall_seconds']} s)")
    return 0 if (data["rows"] or data["base_panel"] or data.get("candidates")) else 1


if __name__ == "__main__":
    sys.exit(main())
