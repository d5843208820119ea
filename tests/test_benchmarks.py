"""benchmarks/: targets.py's verdicts on made-up rows (what is a target and what is only reported), and
throughput.py's code path on a tiny budget."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _targets():
    from benchmarks import targets

    return targets


def _rows(*sampled, greedy=1.0, eps=100.0):
    return [
        {
            "greedy_exact": greedy,
            "sampled_exact": s,
            "episodes_per_second": eps,
            "train_seconds": 10.0,
            "seconds_to_target": 1.0,
        }
        for s in sampled
    ]


def test_ours_must_match_trls_rows_on_every_seed_and_their_speed():
    targets = _targets()
    per_seed = {
        "rloo": _rows(0.95, 0.97, 0.96, eps=100.0),
        "scratch-rloo-quick": _rows(0.98, 0.96, 0.99, eps=90.0),
        "grpo": _rows(0.86, 0.85, 0.82),
        "scratch-grpo-quick": _rows(0.96, 0.96, 0.96, greedy=0.98),
        "scratch-rloo-tuned": _rows(0.98, 0.97, 0.99),
    }
    verdicts = {c["check"]: c["ok"] for c in targets._checks(per_seed)}
    assert verdicts["scratch-rloo-quick seed 0: greedy >= 0.99 and sampled >= rloo's"]
    assert not verdicts["scratch-rloo-quick seed 1: greedy >= 0.99 and sampled >= rloo's"]  # 0.96 < 0.97
    assert not verdicts["scratch-rloo-quick episodes/s >= rloo's"]  # 90 < 100
    assert not verdicts["scratch-grpo-quick seed 0: greedy >= 0.99 and sampled >= grpo's"]  # greedy 0.98
    assert verdicts["scratch-grpo-quick episodes/s >= grpo's"]
    assert not verdicts["scratch-rloo-tuned seed 1: sampled >= 0.98"]


def test_same_config_pairs_are_reported_per_seed_and_only_their_speed_is_checked():
    targets = _targets()
    per_seed = {"grpo": _rows(0.86, 0.85, 0.82, eps=80.0), "scratch-grpo": _rows(0.84, 0.86, 0.82, eps=100.0)}
    checks = targets._checks(per_seed)
    assert [c["check"] for c in checks] == ["scratch-grpo episodes/s >= grpo's"] and checks[0]["ok"]
    [line] = targets._same_config_comparisons(per_seed)
    assert "-0.020 / +0.010 / +0.000" in line and "ours at or ahead on 2 of 3" in line
    assert "greedy exact ours vs TRL's: 1.000 vs 1.000 / 1.000 vs 1.000 / 1.000 vs 1.000" in line


def test_throughput_times_ppo_and_a_critic_free_row(trained_artifacts, tmp_path):
    out = tmp_path / "throughput.json"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "throughput.py"),
            "--policy",
            str(trained_artifacts["policy"]),
            "--reward",
            str(trained_artifacts["reward"]),
            "--backends",
            "scratch",
            "--advantage-estimators",
            "gae,grpo",
            "--separate-critic",
            "--updates",
            "2",
            "--warmup",
            "1",
            "--batch-size",
            "16",
            "--num-ppo-epochs",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {r["backend"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"scratch", "scratch-grpo"} and all(r["episodes_per_second"] > 0 for r in rows.values())
    # no critic: the separate critic's backbone and the value head are not trained
    assert rows["scratch-grpo"]["trainable_parameters"] < rows["scratch"]["trainable_parameters"] / 1.9


def test_the_gpu_benchmark_runs_its_rows_on_cpu_and_writes_a_table_of_a_results_file(tmp_path):
    """benchmarks/gpu.py --tiny: the in-house rows (a pass-size row among them) run on any machine; its table renders
    a results file as docs/results.md shows it."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu.py"),
            "--tiny",
            "--shapes",
            "8x8",
            "--updates",
            "1",
            "--warmup",
            "1",
            "--rows",
            "trl-ext/static-copy+lora,trl-ext/loop+mb2+freeze+adam8+chunked",
            "--profile",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("trl-ext/") and ": {" in line}
    assert set(rows) == {"trl-ext/static-copy+lora", "trl-ext/loop+mb2+freeze+adam8+chunked"}
    assert "'rows_per_pass': 2" in rows["trl-ext/loop+mb2+freeze+adam8+chunked"]
    assert all("'gc_seconds_each_update': [" in line for line in rows.values())
    for line in rows.values():  # the profiled update comes after the one timed update, apart from it
        assert re.search(r"'seconds_each_update': \[[0-9.]+\]", line)
        assert re.search(r"'profile': \{'generate': \{'seconds': [0-9.]+, 'device_ms': [0-9.]+, 'kernels': \[\{", line)
        assert all(f"'{phase}': {{'seconds'" in line for phase in ("reward", "experience", "update"))
    result = {
        "rows": [
            {
                "row": "trl-ext/static+mb8",
                "batch_size": 64,
                "response_length": 128,
                "rows_per_pass": 8,
                "episodes_per_second": 31.37,
                "ms_per_decode_step": 4.26,
                "generate_share": 0.267,
                "seconds_per_update": 2.04,
                "peak_gpu_mb": 13845.4,
                "graphs_compiled_while_timed": 0,
                "first_update_seconds": 12.05,
                "seconds_each_update": [2.0, 2.1, 3.0],
                "timing_phases_per_update": {
                    "timing/generate": 0.548,
                    "timing/experience": 0.47,
                    "timing/update": 0.999,
                },
            }
        ],
        "failed": [{"row": "trl-ppo", "shape": "64x128", "error": "CUDA out of memory"}],
    }
    (tmp_path / "r.json").write_text(json.dumps(result))
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--table", str(tmp_path / "r.json")],
        check=True,
        cwd=ROOT,
        env=env,
    )
    table = (tmp_path / "r.md").read_text()
    # the median update's rate and the slowest update from every timed update's seconds
    assert (
        "| `trl-ext/static+mb8` | 0.5b | 64x128 | 8 | 31.4 | 30.5 | - | 4.3 | 27% | 2.04 (0.55 / 0.47 / 1.00) | 3.00 |"
        in table
    )
    assert "| `trl-ppo` | 0.5b | 64x128 | failed: CUDA out of memory |" in table


def test_the_gpu_benchmark_reads_a_rows_options_and_names_a_bad_one():
    from benchmarks.gpu import row_parts

    assert row_parts("trl-ext/static+lora+critic+gc+mb8") == ("trl-ext/static", {"lora", "critic", "gc"}, 8)
    assert row_parts("trl-ext/static-copy+gc+adam8+chunked") == ("trl-ext/static-copy", {"gc", "adam8", "chunked"}, 0)
    assert row_parts("trl-grpo") == ("trl-grpo", set(), 0)
    assert row_parts("trl-grpo+lora+freeze+adam8") == ("trl-grpo", {"lora", "freeze", "adam8"}, 0)
    for bad, words in [
        ("trl-ext/fast", "unknown row"),
        ("trl-ext/static+qlora", "qlora"),
        ("trl-ext/static+critic", "needs 'lora'"),
        ("trl-grpo+gc", "trl-ext's settings"),
        ("trl-ppo+chunked", "trl-ext's settings"),
    ]:
        with pytest.raises(ValueError, match=words):
            row_parts(bad)


def test_the_memory_options_benchmark_runs_the_settings_asked_for_and_names_an_unknown_one(tmp_path):
    """benchmarks/memory_options.py on a tiny policy: the chosen settings, each in its own process, into --out."""
    script, env = str(ROOT / "benchmarks" / "memory_options.py"), dict(os.environ, OMP_NUM_THREADS="1")
    out = tmp_path / "memory.json"
    tiny = ["--hidden", "32", "--layers", "1", "--vocab", "512", "--batch-size", "4", "--prompt-length", "4"]
    tiny += ["--response-length", "4", "--updates", "2", "--rows-per-pass", "4", "--out", str(out)]
    chosen = "full + reference copy,full + chunked LM head"
    done = subprocess.run(
        [sys.executable, script, *tiny, "--settings", chosen], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert [r["setting"] for r in data["rows"]] == chosen.split(",") and data["settings"]["rows_per_pass"] == 4
    assert all(r["peak_mb"] > 0 for r in data["rows"]) and (tmp_path / "memory.md").exists()
    bad = subprocess.run([sys.executable, script, "--settings", "full,bogus"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown full, bogus; choose from full + reference copy" in bad.stderr
