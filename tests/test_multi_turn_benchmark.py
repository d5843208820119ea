"""benchmarks/multi_turn.py's own logic on a tiny tool-calling model standing in for the warm start: each row
trains through its trainer's tool loop and writes its record, the table is written beside the JSON, and the rows
need a warm start (the real run's --quick mode is the same code on SmolLM2 from --warm-start)."""

import importlib.util
import inspect
import json
import sys
from pathlib import Path

import pytest
from tool_models import tiny_tool_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("multi_turn_benchmark", ROOT / "benchmarks" / "multi_turn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(module.SETTINGS, "batch_size", 4)
    monkeypatch.setitem(module.SETTINGS, "response_length", 24)
    return module


def _has_environments() -> bool:
    from trl import GRPOTrainer

    return "environment_factory" in inspect.signature(GRPOTrainer.__init__).parameters


@pytest.mark.parametrize("row", ["ppo-turn", "grpo", "trl-grpo"])
def test_a_row_trains_from_the_warm_start_and_writes_its_record(bench, tmp_path, row):
    if row == "trl-grpo" and not _has_environments():
        pytest.skip("this TRL's GRPOTrainer takes no environment_factory (the row runs in the newest TRL)")
    warm = tiny_tool_model(tmp_path / "warm")
    out = tmp_path / "row.json"
    bench.run_row(row, seed=0, updates=1, heldout=2, out=out, warm_dir=warm)
    record = json.loads(out.read_text())
    assert record["trainer"] == row and record["updates"] == 1 and len(record["curve"]) == 1
    assert record["held_out_prompts"] == 2 and 0.0 <= record["after"] <= 1.0
    assert record["settings"]["response_length"] == 24
    result = {"quick": True, "command": "multi_turn.py --quick", "machine": {"cpu": "test", "cores": 1},
              "held_out_prompts": 2, "rows": [record], "failed": []}
    bench.write_table(result, tmp_path / "table")
    table = (tmp_path / "table.md").read_text()
    assert f"| {row} | 0 | 4 |" in table and json.loads((tmp_path / "table.json").read_text())["rows"]


def test_rows_need_a_warm_start(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["multi_turn.py"])
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--warm-dir", str(tmp_path / "none")])
    assert "run with --warm-start first" in capsys.readouterr().err
