import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from trl_ext.trl_compat import trl_ppo_available

ROOT = Path(__file__).resolve().parents[1]
# Runnable backends of the default demo: TRL's PPO only where TRL <= 1.12 is installed.
RUNNABLE = ["trl", "scratch"] if trl_ppo_available() else ["scratch"]
TINY = [
    "--pretrain-steps",
    "60",
    "--reward-steps",
    "30",
    "--batch-size",
    "8",
    "--total-episodes",
    "16",
    "--probe-every",
    "1",
    "--probe-n",
    "10",
    "--eval-n",
    "20",
]


def _run(args, timeout=600, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def _cli(*args):
    return _run([sys.executable, "-m", "trl_ext.commands.cli", *args])


def test_demo_end_to_end_tiny_and_resume(tmp_path):
    out = tmp_path / "demo"
    run = _cli("demo", "--out", str(out), *TINY)
    assert run.returncode == 0, run.stderr[-3000:]
    for name in (
        "results.json",
        "report.md",
        "curves.png",
        "policy/model.safetensors",
        "reward/model.safetensors",
        *(f"ppo_{b}/summary.json" for b in RUNNABLE),
    ):
        assert (out / name).exists(), name
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # pretraining ran data parallel on the two workers (one where the machine has one core)
    assert json.loads((out / "policy" / "metrics.json").read_text())["processes"] == min(2, os.cpu_count())
    results = json.loads((out / "results.json").read_text())
    assert [r["backend"] for r in results["rows"]] == ["trl", "scratch"]  # the trl row is there either way
    for row in results["rows"]:
        if row["backend"] not in RUNNABLE:
            continue
        for key in ("greedy_exact", "sampled_exact", "greedy_charset"):
            assert 0.0 <= row[key] <= 1.0
        assert row["episodes"] == 16 and row["episodes_per_second"] > 0 and math.isfinite(row["final_kl"])
        summary = json.loads((out / f"ppo_{row['backend']}" / "summary.json").read_text())  # the row is its run's
        greedy, sampled = summary["greedy"], summary["sampled"]
        assert [row["greedy_exact"], row["sampled_exact"], row["greedy_charset"], row["final_kl"]] == [
            greedy["exact"], sampled["exact"], greedy["charset_acc"], summary["final_kl"]
        ]  # fmt: skip
    report = (out / "report.md").read_text()
    assert "| backend | greedy exact |" in report and "| trl |" in report and "curves.png" in report
    # the rows' settings: what differs between them is said (where the score lands, TRL's PPO has no choice)
    assert "they differ in score_position (ours last_token, TRL's after_last_token)." in report
    assert "greedy exact" in run.stdout  # the terminal table
    # the output is the stages, their progress and the table: no warnings or notices, no library progress bars
    output = run.stdout + run.stderr
    for noise in (
        "Warning",
        "WARNING",
        "it/s]",
        "Writing model shards",
        "Loading weights",
        "Setting accelerator",
        "attention_mask",
        "loss_type",
        "===training policy===",
    ):
        assert noise not in output, (noise, output[-3000:])
    if "trl" not in RUNNABLE:  # newest TRL: the trl row says why it did not run and how to get it
        assert not (out / "ppo_trl").exists()
        for text in (report, run.stdout):
            assert "trl: not run" in text and "needs TRL <= 1.12" in text and "trl-ext[trl-ppo]" in text
    # a second run reuses every finished stage
    again = _cli("demo", "--out", str(out), *TINY)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("reusing") == 2 + len(RUNNABLE)


def test_demo_refuses_foreign_output_dir(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    run = _cli("demo", "--out", str(tmp_path), *TINY)
    assert run.returncode == 2 and "pass --overwrite" in run.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep me" and sorted(os.listdir(tmp_path)) == ["mine.txt"]


def test_compare_tiny_two_seeds(tmp_path):
    out = tmp_path / "cmp"
    run = _cli("compare", "--out", str(out), "--seeds", "2", *TINY)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["backends"]) == {"trl", "scratch"}
    assert all(len(results["backends"][b]) == 2 for b in RUNNABLE)
    report = (out / "report.md").read_text()
    for row in results["rows"]:
        backend = row["backend"]
        if backend not in RUNNABLE:
            assert "needs TRL <= 1.12" in row["not_run"]
            continue
        # each seed's row is its own run's summary, and the table row their mean and population spread
        summaries = [json.loads((out / f"{backend}_seed{s}" / "summary.json").read_text()) for s in (0, 1)]
        assert [s["config"]["train"]["seed"] for s in summaries] == [0, 1]
        per_seed = results["backends"][backend]
        assert [r["greedy_charset"] for r in per_seed] == [s["greedy"]["charset_acc"] for s in summaries]
        assert [r["final_kl"] for r in per_seed] == [s["final_kl"] for s in summaries]
        for key in ("greedy_exact", "greedy_charset", "final_kl"):
            values = [r[key] for r in per_seed]
            assert row[key]["n"] == 2 and row[key]["mean"] == pytest.approx(statistics.fmean(values), rel=1e-12)
            assert row[key]["std"] == pytest.approx(statistics.pstdev(values), rel=1e-9, abs=1e-15)
        (line,) = [x for x in report.splitlines() if x.startswith(f"| {backend} |")]
        assert line.endswith(f"| {row['final_kl']['mean']:.3f} ± {row['final_kl']['std']:.3f} |"), line


@pytest.mark.trl_api  # TRL's GRPOTrainer and RLOOTrainer
def test_compare_grpo_and_rloo_rows(tmp_path):
    out = tmp_path / "cmp"
    run = _cli("compare", "--out", str(out), "--seeds", "1", "--backends", "grpo,rloo,grpo-tuned", *TINY)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert [r["backend"] for r in results["rows"]] == ["grpo", "rloo", "grpo-tuned"]
    assert all(r["greedy_exact"]["mean"] is not None for r in results["rows"])
    # two optimizer steps a generated batch: still one update (and 8 episodes) a batch
    history = [json.loads(x) for x in (out / "grpo-tuned_seed0" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["update"], r["episode"]) for r in history] == [(1, 8), (2, 16)]
    # TRL's group trainers decode without special tokens, where the doubling commands keep the eos: said, not hidden
    summary = json.loads((out / "grpo_seed0" / "summary.json").read_text())
    assert summary["fixed_by_trl"] == {"skip_special_tokens": True}
    assert "[grpo] TRL's GRPO has no choice in skip_special_tokens (runs True, the settings False)" in run.stdout
    assert (
        "rloo: where TRL's RLOO has no choice it differs from the row's settings in skip_special_tokens"
        in (out / "report.md").read_text()
    )


@pytest.mark.parametrize("backend", ["scratch", pytest.param("trl", marks=pytest.mark.needs_trl_ppo)])
def test_multi_cpu_recipe_runs_two_ranks(trained_artifacts, tmp_path, backend):
    out = tmp_path / backend
    from launch import accelerate_port_args

    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *accelerate_port_args(),
        "--config_file",
        str(ROOT / "recipes/accelerate/multi_cpu.yaml"),
        str(ROOT / "recipes/doubling/ppo.py"),
        "--backend",
        backend,
        "--policy",
        str(trained_artifacts["policy"]),
        "--reward",
        str(trained_artifacts["reward"]),
        "--out",
        str(out),
        "--batch-size",
        "8",
        "--total-episodes",
        "32",
        "--probe-every",
        "1",
        "--probe-n",
        "10",
        "--eval-n",
        "20",
    ]
    run = _run(cmd, env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2  # two ranks really ran
    digests = summary["rank_weight_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]  # the ranks' weights bit-equal
    # 32 episodes over 2 ranks of 8: 2 updates, each logged once
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in lines] == [1, 2] and lines[-1]["episode"] == 32
    assert all(math.isfinite(r["objective/scores"]) for r in lines)


def test_recipe_docstrings_give_launch_lines():
    for script in (ROOT / "recipes/doubling").glob("*.py"):
        text = script.read_text()
        assert text.startswith('"""') and ("python recipes/" in text or "accelerate launch" in text), script
    for name in ("single_gpu", "multi_gpu", "deepspeed_zero2", "deepspeed_zero3", "fsdp", "multi_node", "multi_cpu"):
        assert (ROOT / "recipes/accelerate" / f"{name}.yaml").exists()


def test_interrupted_demo_keeps_finished_stages(tmp_path):
    import signal
    import time

    out = tmp_path / "demo"
    long_run = [
        sys.executable,
        "-m",
        "trl_ext.commands.cli",
        "demo",
        "--out",
        str(out),
        *TINY[:-6],
        "--total-episodes",
        "8000",
        "--probe-every",
        "0",
        "--eval-n",
        "20",
    ]
    # A background job of a script ignores SIGINT, and so would the child: give it Ctrl-C back.
    proc = subprocess.Popen(
        long_run,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 300
    # both supervised stages finished (the classifier, then pretraining on the workers)
    while (
        not all((out / stage / "metrics.json").exists() for stage in ("policy", "reward"))
        and time.time() < deadline
        and proc.poll() is None
    ):
        time.sleep(0.2)
    time.sleep(3)  # into the first PPO stage
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode != 0 and (out / "policy" / "metrics.json").exists()
    first = RUNNABLE[0]
    assert not (out / f"ppo_{first}" / "summary.json").exists()
    again = _cli("demo", "--out", str(out), *TINY)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "[policy] reusing" in again.stdout and "[reward] reusing" in again.stdout
    assert (out / f"ppo_{first}" / "summary.json").exists() and (out / "results.json").exists()


def test_recipe_yaml_files_keep_the_tuned_defaults():
    """A recipe must not quietly train a weaker model than the defaults the README's tuning table chose."""
    import yaml

    from trl_ext.commands import ppo, stages

    for name, command in (("pretrain.yaml", stages.PRETRAIN), ("ppo.yaml", ppo.COMMAND)):
        fields = command.fields()
        for key, value in yaml.safe_load((ROOT / "recipes/doubling" / name).read_text()).items():
            default = command.default(key, fields[key][1])
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                assert float(value) == float(default), (name, key, value, default)


def test_compare_with_the_reward_model_beside_the_classifier(tmp_path):
    """`--rewards classifier,reward_model`: a scalar reward model is trained from the pretrained policy on the
    doubling preferences, and every backend runs once with each reward (rows `scratch` and `scratch+rm`)."""
    out = tmp_path / "cmp"
    run = _cli(
        "compare",
        "--out",
        str(out),
        "--seeds",
        "1",
        "--backends",
        "scratch",
        "--rewards",
        "classifier,reward_model",
        "--reward-model-steps",
        "20",
        "--jobs",
        "1",
        *TINY,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert [r["backend"] for r in results["rows"]] == ["scratch", "scratch+rm"]
    rm = json.loads((out / "reward_model" / "config.json").read_text())
    assert len(rm["id2label"]) == 1 and rm["architectures"] == ["GPT2ForSequenceClassification"]
    summary = json.loads((out / "scratch_rm_seed0" / "summary.json").read_text())
    assert summary["config"]["models"]["reward"] == str(out / "reward_model")
    classifier_run = json.loads((out / "scratch_seed0" / "summary.json").read_text())
    assert (summary["config"]["train"]["temperature"], classifier_run["config"]["train"]["temperature"]) == (1.2, 1.0)
    assert "Reward model (+rm rows) held-out pairwise accuracy" in (out / "report.md").read_text()
