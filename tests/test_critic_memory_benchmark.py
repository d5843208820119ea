"""benchmarks/critic_memory.py on a tiny chat model, offline: one row per critic, each with the fields issue 51's
results name, each critic training parameters of its own."""

import json
from pathlib import Path

import pytest
from tiny_models import tiny_qwen2

import benchmarks.harness

pytest.importorskip("reasoning_gym")


def test_each_critic_has_a_row_and_trains_parameters_of_its_own(tmp_path, monkeypatch):
    import benchmarks.critic_memory as bench

    def in_process(cmd, log):  # the row as its subprocess would run it, without a second interpreter
        bench.run_row(cmd[cmd.index("--row") + 1], cmd[cmd.index("--model") + 1], 1, Path(cmd[-1]))
        return 0

    monkeypatch.setattr(benchmarks.harness, "launch_row", in_process)
    monkeypatch.setitem(bench.SETTINGS, "batch_size", 4)
    monkeypatch.setitem(bench.SETTINGS, "response_length", 4)
    model = tiny_qwen2(tmp_path / "chat", chat_template="qwen2.5")
    out = tmp_path / "critic-memory.json"
    assert bench.main(["--model", str(model), "--updates", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {r["critic"]: r for r in data["rows"]}
    assert list(rows) == ["shared head", "separate critic", "critic adapter"] and data["failed"] == []
    for row in rows.values():
        for key in ("task", "trainer", "estimator", "seed", "settings", "after", "seconds_per_update", "invocation"):
            assert key in row
        assert row["peak_rss_mib"] > 0 and row["updates"] == 1
    shared, copy, adapter = (
        rows[k]["trainable_parameters"] for k in ("shared head", "separate critic", "critic adapter")
    )
    assert shared < adapter and shared < copy  # each critic trains parameters of its own beside the policy's
    assert "| critic adapter |" in out.with_suffix(".md").read_text()
