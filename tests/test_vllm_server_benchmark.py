"""benchmarks/vllm_server.py without training or vLLM: the plan it runs (the committed plan's settings), the paired
t interval and the verdicts on fabricated runs, the speed summary and ratios, and the tables rendered from JSON."""

import json
import math
import statistics

import pytest

from benchmarks import vllm_server as bench
from benchmarks.harness import write_results
from benchmarks.vllm_server_tables import learning_table, sig, speed_table


def test_the_speed_plan_is_the_committed_one():
    plan = bench.speed_plan()
    assert plan["model"] == "SmolLM2-135M-Instruct" and plan["task"] == "reasoning-gym:basic_arithmetic"
    assert (plan["untimed_updates"], plan["timed_updates"], plan["repeats"]) == (1, 5, 2)
    assert plan["prompt_stream"] == {"split": "train", "seed": 0, "prompts": 96}
    ppo = plan["ppo"]
    assert ppo == dict(
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
        total_episodes=96,
        sampler="vllm",
    )
    assert plan["lora"] == dict(
        r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    order = ["colocate-s0", "colocate-s1", "server-s0", "server-s1"]
    assert plan["jobs"] == [[name, repeat] for repeat in (0, 1) for name in order]
    assert {n: (r["layout"], r["max_staleness"]) for n, r in plan["rows"].items()} == {
        "colocate-s0": ("colocate", 0),
        "colocate-s1": ("colocate", 1),
        "server-s0": ("server", 0),
        "server-s1": ("server", 1),
    }
    assert plan["layout"]["trainer"] == {
        "colocate": {"cores": "0,1", "threads": 2},
        "server": {"cores": "0", "threads": 1},
    }
    assert plan["layout"]["server_cores"] == [1]
    smoke = bench.speed_plan(smoke=True)
    assert (smoke["timed_updates"], smoke["repeats"], smoke["ppo"]["total_episodes"]) == (1, 1, 32)
    assert bench.smoke_deviations("speed") and bench.speed_plan() == plan  # the smoke leaves the defaults alone


def test_the_learning_plan_is_the_committed_one():
    plan = bench.learning_plan()
    assert plan["seeds"] == [201, 202, 203, 204, 205, 206]
    assert plan["ppo"] == dict(
        sampler="vllm",
        skip_special_tokens=False,
        separate_critic=True,
        batch_size=64,
        total_episodes=6400,
        learning_rate=1e-3,
        vllm_importance_sampling_correction=True,
    )
    assert plan["updates"] == 100 and plan["evaluation"] == dict(n=500, seed=777, sample=False)
    assert plan["policy"]["shape"] == {"n_embd": 64, "n_head": 2} and plan["policy"]["pretrain_steps"] == 1500
    assert plan["policy"]["pretrain_seed"] == 0
    # the two colocated rows of a seed start side by side; the server rows one at a time after them
    first = [["colocate-s0", 201], ["colocate-s1", 201], ["colocate-s0", 202], ["colocate-s1", 202]]
    assert plan["colocate_jobs"][:4] == first
    assert len(plan["colocate_jobs"]) == len(plan["server_jobs"]) == 12
    assert {name for name, _ in plan["server_jobs"]} == {"server-s0", "server-s1"}
    smoke = bench.learning_plan(smoke=True)
    assert smoke["seeds"] == [201] and smoke["updates"] == 2 and smoke["policy"]["pretrain_steps"] == 50
    assert "1500" in bench.smoke_deviations("learning")[0]


def test_row_commands_pin_the_run_to_the_plans_cores(tmp_path):
    spec = {"cores": "0,1", "threads": 2, "row": "colocate-s0"}
    cmd = bench.row_command(spec, tmp_path / "spec.json", tmp_path / "out.json")
    assert cmd[:6] == ["env", "OMP_NUM_THREADS=2", "MKL_NUM_THREADS=2", "taskset", "-c", "0,1"]
    assert cmd[-4:] == ["--row-spec", str(tmp_path / "spec.json"), "--row-out", str(tmp_path / "out.json")]
    assert json.loads((tmp_path / "spec.json").read_text()) == spec


def test_t_quantiles_and_the_paired_interval():
    assert bench.t_quantile_975(5) == pytest.approx(2.5706, abs=1e-4)
    assert bench.t_quantile_975(1) == pytest.approx(12.706, abs=1e-3)
    assert bench.t_quantile_975(31) == pytest.approx(2.0395, abs=2e-3)  # the expansion beyond the table
    assert bench.t_quantile_975(1000) == pytest.approx(1.9623, abs=1e-3)
    with pytest.raises(ValueError):
        bench.t_quantile_975(0)
    d = [0.1, -0.05, 0.0, 0.2, 0.05, -0.1]
    stats = bench.paired_interval(d)
    half = 2.5706 * statistics.stdev(d) / math.sqrt(6)
    assert stats["dof"] == 5 and stats["mean"] == pytest.approx(0.2 / 6)
    assert stats["interval"] == pytest.approx([0.2 / 6 - half, 0.2 / 6 + half])
    one = bench.paired_interval([0.3])
    assert one["mean"] == 0.3 and one["interval"] is None and one["dof"] is None


def _learning_runs(after: dict[str, list[float]], seeds=(201, 202, 203, 204, 205, 206)) -> list[dict]:
    return [
        {
            "row": row,
            "seed": seed,
            "before": {"exact": 0.2, "charset_acc": 0.6},
            "after": {"exact": value, "charset_acc": 0.9},
            "seconds_per_update": 0.5,
        }
        for row, values in after.items()
        for seed, value in zip(seeds, values)
    ]


def test_verdicts_follow_the_plans_rules():
    base = [0.9, 0.8, 1.0, 0.7, 0.95, 0.85]
    runs = _learning_runs(
        {
            "colocate-s0": base,
            "server-s0": [v + 0.15 + 0.01 * (i % 2) for i, v in enumerate(base)],  # +0.15, tight: not within 0.1
            "colocate-s1": [v - 0.04 for v in base],  # -0.04 >= -0.05: no worse by the mean
            "server-s1": [v - 0.3 for v in [b + 0.15 + 0.01 * (i % 2) for i, b in enumerate(base)]],  # far worse
        }
    )
    verdicts = {v["name"]: v for v in bench.learning_verdicts(runs)}
    server = verdicts["server learns what colocated learns"]
    assert server["rows"] == ["server-s0", "colocate-s0"] and server["dof"] == 5
    assert server["mean"] == pytest.approx(0.155) and server["interval"][0] > 0
    assert server["holds"] is False and server["by_mean"] is False
    assert list(server["differences"]) == ["201", "202", "203", "204", "205", "206"]
    colocated = verdicts["one step off no worse (colocated)"]
    assert colocated["mean"] == pytest.approx(-0.04) and colocated["holds"] is True and colocated["by_mean"] is True
    assert verdicts["one step off no worse (server)"]["holds"] is False

    # a mean outside the margin whose interval holds 0 passes (noisy seeds): the plan's "or"
    spread = [0.6, -0.3, 0.4, -0.2, 0.3, -0.1]
    noisy = _learning_runs({"colocate-s0": base, "server-s0": [v + d for v, d in zip(base, spread)]})
    verdict = bench.learning_verdicts(noisy)[0]
    assert verdict["mean"] == pytest.approx(0.7 / 6)
    assert verdict["by_mean"] is False and verdict["interval_holds_zero"] is True and verdict["holds"] is True
    # rows that did not run: no verdict
    missing = bench.learning_verdicts(_learning_runs({"colocate-s0": base}))
    assert all(v["holds"] is None and v["differences"] == {} for v in missing)


def _update(n, seconds, generate, timed=True, last=False, threads=1):
    rest = seconds - generate
    return {
        "update": n,
        "timed": timed,
        "last": last,
        "seconds": seconds,
        "phases": {"generate": generate, "reward": 0.0, "experience": rest / 2, "update": rest / 2},
        "sync_seconds": 0.5,
        "torch_threads": threads,
    }


def _speed_runs(s1_seconds: float, generate_s0: float) -> list[dict]:
    runs = []
    for repeat in (0, 1):
        for row, (layout, staleness) in bench.ROWS.items():
            threads = 2 if layout == "colocate" else 1
            seconds = 10.0 if staleness == 0 else s1_seconds
            if layout == "server":
                seconds *= 1.1
            generate = generate_s0 if staleness == 0 else 0.1
            updates = [_update(1, 30.0, 5.0, timed=False, threads=threads)]
            updates += [_update(n, seconds, generate, last=n == 6, threads=threads) for n in range(2, 7)]
            runs.append({"row": row, "seed": 0, "repeat": repeat, "updates": updates})
    return runs


def test_speed_summary_and_the_issues_target():
    summary = bench.speed_summary(_speed_runs(s1_seconds=7.0, generate_s0=5.0))
    assert list(summary) == bench.ORDER
    s0 = summary["colocate-s0"]
    assert s0["median_seconds"] == 10.0 and s0["generation_share"] == pytest.approx(0.5)
    assert s0["timed_updates"] == 10 and s0["repeats"] == 2 and s0["repeat_means"] == [10.0, 10.0]
    assert s0["median_phases"]["generate"] == 5.0 and s0["trainer_cores"] == "0,1"
    ratios = {r["name"]: r for r in bench.speed_ratios(summary)}
    assert ratios["colocate-s1 / colocate-s0"]["ratio"] == pytest.approx(0.7)
    assert ratios["colocate-s1 / colocate-s0"]["meets"] is True
    assert ratios["server-s0 / colocate-s0"]["ratio"] == pytest.approx(1.1)
    assert ratios["server-s1 / colocate-s1"]["target"] is None
    # generation under a third of s0's update: the target does not apply, whatever the ratio
    low = {r["name"]: r for r in bench.speed_ratios(bench.speed_summary(_speed_runs(9.0, 3.0)))}
    assert low["server-s1 / server-s0"]["target_applies"] is False and low["server-s1 / server-s0"]["meets"] is None
    assert low["server-s1 / server-s0"]["verdict"].startswith("not applicable")
    # s1 above 0.8 x s0 where generation is half the update: missed
    slow = {r["name"]: r for r in bench.speed_ratios(bench.speed_summary(_speed_runs(9.0, 5.0)))}
    assert slow["colocate-s1 / colocate-s0"]["meets"] is False and slow["colocate-s1 / colocate-s0"]["verdict"] == "no"
    # a run whose updates had other torch threads than the layout gives is named
    runs = _speed_runs(7.0, 5.0)
    runs[0]["updates"][3]["torch_threads"] = 1
    assert len(bench.thread_deviations(runs, bench.SPEED_LAYOUT)) == 1


def _record(part: str) -> dict:
    plan = bench.speed_plan() if part == "speed" else bench.learning_plan()
    return {
        "benchmark": "vllm-server",
        "part": part,
        "invocation": "20260101T000000-abcdef",
        "command": f"OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_server.py --part {part}",
        "git_commit": "abc1234",
        "machine": {"cpu": "a CPU", "cpu_count": 2, "torch": "2.x", "trl": "1.x"},
        "vllm": "0.32.0",
        "plan": {"path": "benchmarks/vllm_server_plan.md", "sha256": "0" * 64},
        "smoke": False,
        "settings": plan,
        "rows": bench.ORDER,
        "deviations": [],
        "runs": [],
        "failed": [],
    }


def test_tables_render_from_the_json(tmp_path):
    data = _record("speed")
    data["runs"] = _speed_runs(7.0, 5.0)
    data["summary"] = bench.speed_summary(data["runs"])
    data["ratios"] = bench.speed_ratios(data["summary"])
    data["server"] = {"cpu_seconds_by_row": [{"row": "colocate-s0", "repeat": 0, "server_cpu_seconds": 0.4}]}
    written = write_results(tmp_path / "vllm-server-speed-cpu.json", data, lambda d: speed_table(d, "speed.json"))
    table = (tmp_path / "vllm-server-speed-cpu.md").read_text()
    assert table.startswith("Seconds per PPO update") and "like for like" in table.splitlines()[0]
    assert "| `colocate-s0` | colocate | 0,1 | 10.0 | 5.00 |" in table
    assert "| colocate-s1 / colocate-s0 | 0.700 |" in table and "Deviations from the plan: none." in table
    assert written["summary"]["server-s1"]["median_seconds"] == pytest.approx(7.7)

    data = _record("learning")
    base = [0.9, 0.8, 1.0, 0.7, 0.95, 0.85]
    data["runs"] = _learning_runs({name: base for name in bench.ORDER})
    data["verdicts"] = bench.learning_verdicts(data["runs"])
    data["deviations"] = ["failed: server-s1 206 (exit 1): boom"]
    write_results(tmp_path / "learning.json", data, lambda d: learning_table(d, "learning.json"))
    table = (tmp_path / "learning.md").read_text()
    assert table.startswith("Greedy exact accuracy on 500 held-out") and "100 updates of 64" in table
    header = next(line for line in table.splitlines() if line.startswith("| row | before"))
    assert all(f"after, seed {s}" in header for s in bench.SEEDS)
    assert "| `server-s0` | 0.200 | 0.900 | 0.800 | 1.00 | 0.700 | 0.950 | 0.850 | 0.867 | 0.900 | 0.500 |" in table
    assert "| server learns what colocated learns | `server-s0` - `colocate-s0` |" in table
    assert "- failed: server-s1 206 (exit 1): boom" in table


def test_significant_digits():
    assert [sig(v) for v in (0.0123456, 1.23456, 12.3456, 123.456, 1234.5, 0, None)] == [
        "0.0123",
        "1.23",
        "12.3",
        "123",
        "1234",
        "0",
        "-",
    ]
    assert sig(0.6667, 2) == "0.67" and sig(True) == "yes"


def test_smoke_never_writes_into_the_results_folder(monkeypatch):
    from trl_ext.ppo.rollout import vllm_sampler

    monkeypatch.setattr(vllm_sampler, "vllm_installed", lambda: True)
    with pytest.raises(SystemExit):
        bench.main(["--part", "speed", "--smoke", "--out-dir", str(bench.RESULTS)])
