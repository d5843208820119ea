"""benchmarks/public_tasks.py on a tiny chat model, offline: the base panel and a training row (--quick, 1 task,
1 update) write the JSON fields issue 52 asks for, and their tables render."""

import importlib
import json
import sys
from pathlib import Path

import pytest
from tiny_models import tiny_qwen2

import benchmarks.harness

pytest.importorskip("reasoning_gym")


def in_process(bench):
    """The harness's row launcher, running the row as its subprocess would, without a second interpreter."""

    def launch(cmd, log):
        spec_file, out = cmd[cmd.index("--row") + 1], cmd[cmd.index("--row-out") + 1]
        bench.run_row(json.loads(open(spec_file).read()), Path(out))
        return 0

    return launch


@pytest.fixture()
def bench(monkeypatch):
    import benchmarks.public_tasks

    module = importlib.reload(benchmarks.public_tasks)
    monkeypatch.setitem(module.QUICK, "tokens", 4)
    monkeypatch.setitem(module.QUICK, "panel_prompts", 2)
    monkeypatch.setitem(module.QUICK, "eval_prompts", 2)
    monkeypatch.setattr(sys, "argv", ["public_tasks.py"])
    return module


def test_base_panel_records_each_models_score_per_task(bench, tmp_path):
    model = tiny_qwen2(tmp_path / "chat", chat_template="qwen2.5")
    stem = tmp_path / "panel"
    assert (
        bench.main(
            ["--base-panel", "--quick", "--models", str(model), "--tasks", "basic_arithmetic", "--out", str(stem)]
        )
        == 0
    )
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["rows"] == [] and data["command"] and data["machine"]["device"] == "cpu"
    result = data["base_panel"]["chat"]["tasks"]["basic_arithmetic"]
    for mode in ("greedy", "sampled"):
        assert 0.0 <= result[mode]["score"] <= 1.0 and result[mode]["answers"] == 2
        assert 0 <= result[mode]["tagged"] <= 2
    table = stem.with_suffix(".md").read_text()
    assert table.startswith("*Source: [`benchmarks/results/panel.json`]")
    assert "| chat | `basic_arithmetic` | 2 |" in table


def test_a_training_row_has_every_field(bench, tmp_path, monkeypatch):
    model = tiny_qwen2(tmp_path / "chat", chat_template="qwen2.5")

    monkeypatch.setattr(benchmarks.harness, "launch_row", in_process(bench))
    monkeypatch.setitem(bench.SETTINGS, "batch_size", 4)
    stem = tmp_path / "train"
    assert (
        bench.main(
            [
                "--train",
                "--quick",
                "--models",
                str(model),
                "--tasks",
                "chain_sum",
                "--rows",
                "ppo,ppo-critic-adapter,ppo-combination",
                "--updates",
                "1",
                "--out",
                str(stem),
            ]
        )
        == 0
    )
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["base_panel"] == {} and data["failed"] == []
    row, combination_row, adapter_row = sorted(data["rows"], key=lambda r: r["trainer"])
    for key in (
        "model",
        "task",
        "trainer",
        "estimator",
        "seed",
        "before",
        "after",
        "seconds_per_update",
        "peak_rss_mib",
        "invocation",
        "distinct_questions",
    ):
        assert row[key] is not None, key
    assert row["test_overlap"] == 0  # no test prompt's question among the training prompts
    assert "(`test_overlap`): 0 in every row" in stem.with_suffix(".md").read_text()
    assert (row["model"], row["task"], row["trainer"], row["updates"]) == ("chat", "chain_sum", "ppo", 1)
    assert row["invocation"] == data["invocation"] and data["plan"]["sha256"]
    assert "| chat | `chain_sum` | ppo | 11 | 1 |" in stem.with_suffix(".md").read_text()
    # amendment 2c's row: the same PPO with the critic as a second LoRA adapter, and only that different
    assert adapter_row["trainer"] == "ppo-critic-adapter" and adapter_row["settings"].pop("critic_adapter") is True
    assert adapter_row["settings"] == row["settings"] and "critic_adapter" not in row["settings"]
    # issue 51's candidate: decoupled GAE and the positive-sample LM loss on the same PPO, nothing else
    assert {k: v for k, v in combination_row["settings"].items() if row["settings"].get(k) != v} == {
        "critic_lam": 1.0,
        "positive_lm_coef": 0.1,
        "positive_lm_threshold": 0.5,
    }
    assert combination_row["estimator"] == "gae"
    with pytest.raises(SystemExit):
        bench.main(["--train", "--quick", "--plan", str(tmp_path / "no-plan.md")])


def test_the_qualifying_rule_and_the_choice_of_candidates(bench):
    panel = {
        "m": {
            "tasks": {
                t: {"sampled": {"score": s}} for t, s in (("a", 0.0), ("b", 0.05), ("c", 0.35), ("d", 0.7), ("e", 0.6))
            }
        }
    }
    assert bench.qualifying(panel, "m") == ["c", "b", "e"]
    cands = [{"task": t, "sampled": {"score": s}} for t, s in (("a", 0.3), ("a", 0.31), ("b", 0.9), ("c", 0.0))]
    assert [(c["task"], c["qualifies"]) for c in bench.chosen(cands)] == [("a", True), ("c", False)]


def test_the_cost_rows_run_each_model_at_the_same_shapes(bench, tmp_path, monkeypatch):
    small = tiny_qwen2(tmp_path / "small", chat_template="qwen2.5")
    large = tiny_qwen2(tmp_path / "large", chat_template="qwen2.5")
    monkeypatch.setattr(benchmarks.harness, "launch_row", in_process(bench))
    stem = tmp_path / "cost"
    assert bench.main(["--cost", "--quick", "--models", f"{small},{large}", "--out", str(stem)]) == 0
    data = json.loads(stem.with_suffix(".json").read_text())
    assert [r["model"] for r in data["rows"]] == ["small", "large"]
    assert len({json.dumps(r["settings"], sort_keys=True) for r in data["rows"]}) == 1
    assert all(r["before"] is None and r["seconds_per_update"] > 0 for r in data["rows"])
    assert "large " in stem.with_suffix(".md").read_text().split("Against small: ")[1]


def test_the_amendments_selection_reads_the_last_number(bench, tmp_path):
    model = tiny_qwen2(tmp_path / "chat", chat_template="qwen2.5")
    stem = tmp_path / "select"
    argv = ["--select", "--quick", "--answer-format", "last-number", "--models", str(model), "--out", str(stem)]
    assert bench.main([*argv, "--tasks", "chain_sum,coin_flip"]) == 0
    data = json.loads(stem.with_suffix(".json").read_text())
    found = [(c["task"], c["difficulty"], c["answer_format"]) for c in data["candidates"]]
    assert found == [
        ("chain_sum", "default", "last-number"),
        ("chain_sum", "easy", "last-number"),
        ("coin_flip", "default", "last-number"),
    ]
    assert all(c["sampled"]["answers"] == 2 and c["max_new_tokens"] == 4 for c in data["candidates"])
    table = stem.with_suffix(".md").read_text()
    assert "| `chain_sum` | last-number | default | easy | 4 |" in table and "the plan's section 2b" in table


def test_the_summary_pairs_each_trainer_with_trls_grpo_seed_by_seed():
    from benchmarks.public_tasks_tables import summary_table

    def row(trainer, seed, before, after):
        return dict(
            task="t",
            trainer=trainer,
            seed=seed,
            before=before,
            after=after,
            after_greedy=after,
            seconds_per_update=10.0,
        )

    rows = [
        row("ppo", 1, 0.1, 0.5),
        row("trl-grpo", 1, 0.1, 0.4),
        row("ppo", 2, 0.2, 0.3),
        row("trl-grpo", 2, 0.2, 0.6),
    ]
    lines = summary_table(rows).splitlines()
    assert lines[2] == "| `t` | ppo | 1,2 | 0.150 | 0.400 | 0.250 | 1 of 2 | 1 of 2 | 0.400 | 10.0 |"
    assert lines[3] == "| `t` | trl-grpo | 1,2 | 0.150 | 0.500 | 0.350 | 2 of 2 | - | 0.500 | 10.0 |"
    # without TRL's rows at those seeds there is nothing to be above: "-", not "0 of 0"
    alone = summary_table([r for r in rows if r["trainer"] == "ppo"]).splitlines()
    assert alone[2] == "| `t` | ppo | 1,2 | 0.150 | 0.400 | 0.250 | 1 of 2 | - | 0.400 | 10.0 |"


def test_a_run_a_seed_an_invocation_merges_into_one_judged_result(bench, tmp_path, capsys):
    settings = {"temperature": 0.7, "batch_size": 16, "response_length": 32}

    def row(trainer, task, seed, after, invocation, **over):
        found = dict(
            {k: None for k in ("system_prompt", "task_config", "answer_format", "split")},
            model="SmolLM2",
            task=task,
            trainer=trainer,
            seed=seed,
            invocation=invocation,
            updates=20,
            eval_prompts=64,
            settings=settings,
            before=0.3,
            after=after,
            after_greedy=after,
            seconds_per_update=30.0,
            peak_rss_mib=6400.0,
        )
        return {**found, **over}

    def result(seed, invocation, rows, failed=()):
        path = tmp_path / f"seed{seed}-{invocation}.json"
        data = dict(benchmark="public-tasks", mode="train", quick=False, command=f"run {seed}", invocation=invocation)
        data.update(plan={"path": "plan.md", "sha256": invocation}, machine={}, rows=rows, failed=list(failed))
        path.write_text(json.dumps(dict(data, wall_seconds=100.0)))
        return str(path)

    trainers = {"ppo": 0.5, "ppo-combination": 0.7, "grpo": 0.6, "trl-grpo": 0.55}
    first = result(17, "a", [row(t, task, 17, v, "a") for t, v in trainers.items() for task in ("x", "y")])
    second = result(18, "b", [row(t, task, 18, v, "b") for t, v in trainers.items() for task in ("x", "y")])
    stem = tmp_path / "merged"
    assert bench.main(["--merge", first, second, "--out", str(stem)]) == 0
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["invocations"] == ["a", "b"] and data["commands"] == ["run 17", "run 18"]
    assert sorted({(r["seed"], r["invocation"]) for r in data["rows"]}) == [(17, "a"), (18, "b")]
    assert data["plans"] == {"a": {"path": "plan.md", "sha256": "a"}, "b": {"path": "plan.md", "sha256": "b"}}
    table = stem.with_suffix(".md").read_text()
    assert "made by `run 17`; `run 18`, merged by" in table
    assert "| target (issue 51), every task | measured | met |" in table  # judged over both seeds' four pairs
    assert "| ppo-combination ahead of trl-grpo on at least 3 of 4 task-seed pairs | 4 | yes |" in table
    assert "| ppo-combination s/update <= 1.25x grpo's, invocation b | 1.00x | yes |" in table

    again = result(17, "c", [row("ppo", "x", 17, 0.5, "c")])  # the same row measured twice: refused
    with pytest.raises(SystemExit):
        bench.main(["--merge", first, again, "--out", str(tmp_path / "twice")])
    assert "rows measured twice" in capsys.readouterr().err
    other = result(19, "d", [row("ppo", "x", 19, 0.5, "d", eval_prompts=32)])  # another test set: refused
    with pytest.raises(SystemExit):
        bench.main(["--merge", first, other, "--out", str(tmp_path / "other")])
    assert "ppo on x ran at other settings" in capsys.readouterr().err
    assert not (tmp_path / "twice.json").exists() and not (tmp_path / "other.json").exists()
    selection = tmp_path / "select.json"  # only --train results merge
    selection.write_text(json.dumps(dict(json.loads(Path(first).read_text()), mode="select")))
    with pytest.raises(SystemExit):
        bench.main(["--merge", str(selection), second, "--out", str(tmp_path / "select-merged")])
    assert "--train results only, not ['select']" in capsys.readouterr().err
    killed = {"model": "SmolLM2", "task": "x", "trainer": "grpo", "seed": 19, "returncode": -9, "error": "update 3"}
    failed = result(19, "e", [], failed=[killed])
    rerun = result(19, "f", [row("grpo", "x", 19, 0.6, "f")])
    assert bench.main(["--merge", failed, rerun, "--out", str(tmp_path / "rerun")]) == 0
    data = json.loads((tmp_path / "rerun.json").read_text())
    assert data["failed"] == [] and data["reruns"] == [killed]
    assert "Run again in a later invocation: grpo x seed 19: update 3" in (tmp_path / "rerun.md").read_text()
