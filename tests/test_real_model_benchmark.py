"""benchmarks/real_model.py's own logic on a tiny chat checkpoint: a held-out score taken in the middle of a run
leaves the run as it was, and settings given on the command line win over a row's."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_qwen2

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("real_model_benchmark", ROOT / "benchmarks" / "real_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(module.SETTINGS, "response_length", 3)
    return module


def test_held_out_during_a_run_keeps_the_random_state_and_train_mode(bench, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.tasks.real_model.task import heldout_rows

    folder = tiny_qwen2(tmp_path / "chat", chat_template="qwen2.5")
    policy, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    policy.train()
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    score = bench.held_out_during(policy, tokenizer, heldout_rows()[:4], seed=0)
    assert 0.0 <= score <= 1.0
    assert policy.training, "the trainer's mode must come back"
    assert torch.equal(torch.random.get_rng_state(), state), "TRL's trainers sample from the global generator"


def test_set_overrides_every_row_and_must_be_json(bench, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["real_model.py"])
    with pytest.raises(SystemExit):
        bench.main(["--set", "whiten_advantages=maybe", "--rows", "scratch-ppo"])
    assert "must be JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a known setting parses; the unknown row stops it before anything runs
        bench.main(["--set", "whiten_advantages=true", "--rows", "nope"])
    assert bench.OVERRIDES == {"whiten_advantages": True}
    assert bench.ROWS["scratch-ppo"][4] == {"whiten_advantages": False}
    assert bench.settings_of("scratch-ppo")["whiten_advantages"] is True  # --set beats the row's own
    assert bench.settings_of("scratch-grpo") == dict(bench.SETTINGS, kl_coef=0.0, scale_rewards="none",
                                                     whiten_advantages=True)


def test_collect_writes_results_with_a_setting_given_on_the_command_line(bench, tmp_path, monkeypatch):
    import json

    row = {"trainer": "scratch-ppo", "seed": 0, "episodes": 16, "before": 0.1, "after": 0.5, "before_greedy": 0.1,
           "after_greedy": 0.5, "seconds_per_update": 1.0, "peak_rss_mib": 1.0, "device": "cpu",
           "settings": dict(bench.SETTINGS, whiten_advantages=False),
           "curve": [{"update": 1, "seconds": 1.0, "reward": 0.2, "held_out": 0.3}, {"update": 2, "seconds": 2.0,
                                                                                      "reward": 0.4}]}
    (tmp_path / "row.json").write_text(json.dumps(row))
    monkeypatch.setattr(sys, "argv", ["real_model.py"])
    assert bench.main(["--set", "learning_rate=2e-4", "--collect", str(tmp_path / "row.json"),
                       "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["settings"]["learning_rate"] == 2e-4 and written["rows"] == [row]
    assert written["row_settings"] == {"scratch-ppo": {"whiten_advantages": False}}  # as the row recorded them
    assert "| scratch-ppo | 0 | 16 | 0.100 (0.100) | 0.500 (0.500) |" in (tmp_path / "out.md").read_text()
