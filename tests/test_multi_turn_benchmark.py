"""benchmarks/multi_turn.py's own logic on a tiny tool-calling model standing in for the warm start: each row
trains through its trainer's tool loop and writes its record, the table is written beside the JSON, and the rows
need a warm start (the real run's --quick mode is the same code on SmolLM2 from --warm-start)."""

import hashlib
import importlib
import inspect
import json
import sys

import pytest
from tool_models import tiny_tool_model

from benchmarks.harness import evaluating


@pytest.fixture()
def bench(monkeypatch):
    import benchmarks.multi_turn

    module = importlib.reload(benchmarks.multi_turn)  # SETTINGS as the file sets them (a row updates them)
    monkeypatch.setitem(module.SETTINGS, "batch_size", 4)
    monkeypatch.setitem(module.SETTINGS, "response_length", 24)
    return module


def _has_environments() -> bool:
    from trl import GRPOTrainer

    return "environment_factory" in inspect.signature(GRPOTrainer.__init__).parameters


@pytest.mark.parametrize("row", ["ppo-turn", "grpo", "trl-grpo", "ppo-final-combination"])
def test_a_row_trains_from_the_warm_start_and_writes_its_record(bench, tmp_path, row):
    if row == "trl-grpo" and not _has_environments():
        pytest.skip("this TRL's GRPOTrainer takes no environment_factory (the row runs in the newest TRL)")
    warm = tiny_tool_model(tmp_path / "warm")
    out = tmp_path / "row.json"
    bench.run_row(row, seed=0, updates=1, heldout=2, out=out, warm_dir=warm)
    record = json.loads(out.read_text())
    assert record["trainer"] == row and record["updates"] == 1 and len(record["curve"]) == 1
    assert record["held_out_prompts"] == 2
    # the scores, recounted from the saved conversations (both prompts) with the task's reward
    from trl_ext.tasks.real_model.tool_task import right_code

    for mode, score in (("sampled", record["after"]), ("greedy", record["after_greedy"])):
        shown = record["after_detail"][mode]["examples"]
        assert (
            len(shown) == 2 and score == sum(right_code([e["messages"] for e in shown], [e["code"] for e in shown])) / 2
        )
    assert record["settings"]["response_length"] == 24
    assert record["settings"] == {**bench.SETTINGS, **bench.ROWS[row][4]} and record["task"] == "tool"
    result = {
        "quick": True,
        "command": "multi_turn.py --quick",
        "machine": {"cpu": "test", "cores": 1},
        "held_out_prompts": 2,
        "rows": [record],
        "failed": [],
    }
    bench.write_table(result, tmp_path / "table")
    table = (tmp_path / "table.md").read_text()
    assert f"| {row} | 0 | 4 |" in table and json.loads((tmp_path / "table.json").read_text())["rows"]


def test_the_test_split_scores_the_row_and_the_warm_start_once(bench, tmp_path, monkeypatch):
    from trl_ext.tasks.real_model.tool_task import eval_rows

    warm = tiny_tool_model(tmp_path / "warm")
    out = tmp_path / "row.json"
    bench.run_row("ppo-turn", seed=0, updates=1, heldout=2, out=out, warm_dir=warm, split="test")
    record = json.loads(out.read_text())
    asked = [r["prompt"][0]["content"] for r in eval_rows("test")[:2]]
    assert record["split"] == "test" and [e["prompt"] for e in record["after_detail"]["greedy"]["examples"]] == asked
    measured = bench.measure_warm_start(warm, "test", 2)
    assert measured["split"] == "test" and measured["held_out_prompts"] == 2
    assert (warm / bench.MEASURED["test"]).is_file() and not (warm / bench.MEASURED["heldout"]).exists()
    monkeypatch.setattr(bench, "load", lambda _: pytest.fail("measured again"))
    assert bench.measure_warm_start(warm, "test", 2) == measured  # kept in the warm start's folder
    monkeypatch.undo()
    assert bench.measure_warm_start(warm, "test", 1)["held_out_prompts"] == 1  # a smaller one is measured ...
    assert bench.warm_start_measured(warm, "test") == measured  # ... and replaces nothing


def test_trl_gets_every_setting_both_trainers_express(bench, tmp_path, monkeypatch):
    import trl

    given = {}

    class Stop(Exception):
        pass

    def config(**kwargs):
        given.update(kwargs)
        raise Stop

    monkeypatch.setattr(trl, "GRPOConfig", config)
    cfg = bench.row_config("trl-grpo", 0, 1)
    with pytest.raises(Stop):
        bench.train_trl_grpo(None, None, None, None, None, cfg, 1, None, None)
    s = bench.settings_of("trl-grpo")
    assert (given["max_grad_norm"], given["learning_rate"], given["temperature"]) == (
        s["max_grad_norm"],
        s["learning_rate"],
        s["temperature"],
    )
    assert (given["num_iterations"], given["max_completion_length"], given["per_device_train_batch_size"]) == (
        s["num_ppo_epochs"],
        s["response_length"],
        s["batch_size"],
    )
    assert (given["beta"], given["scale_rewards"], given["epsilon"]) == (
        s["kl_coef"],
        s["scale_rewards"],
        cfg.cliprange,
    )


def test_rows_need_a_warm_start(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["multi_turn.py"])
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--warm-dir", str(tmp_path / "none")])
    assert "run with --warm-start first" in capsys.readouterr().err


@pytest.mark.parametrize("row", ["trl-grpo"])  # trl-ext's rows sample from their own generator: no case to fail
def test_held_out_scores_during_training_leave_the_run_unchanged(bench, tmp_path, row):
    if row == "trl-grpo" and not _has_environments():
        pytest.skip("this TRL's GRPOTrainer takes no environment_factory (the row runs in the newest TRL)")
    warm = tiny_tool_model(tmp_path / "warm")
    records = []
    for eval_every in (0, 1):
        out = tmp_path / f"row-{eval_every}.json"
        bench.run_row(row, seed=0, updates=2, heldout=2, out=out, warm_dir=warm, eval_every=eval_every)
        records.append(json.loads(out.read_text()))
    plain, evaluated = records
    assert "held_out" in evaluated["curve"][0] and "held_out" not in evaluated["curve"][1]  # the last: `after`

    def sampled(curve):  # what the run sampled and measured, not how long it took
        return [
            {k: v for k, v in c.items() if k not in ("seconds", "held_out") and not k.startswith("timing/")}
            for c in curve
        ]

    assert sampled(plain["curve"]) == sampled(evaluated["curve"])
    assert [plain["after_detail"][m]["examples"] for m in ("greedy", "sampled")] == [
        evaluated["after_detail"][m]["examples"] for m in ("greedy", "sampled")
    ]


def _row(trainer, seed, after, curve_scores, seconds=1.0):
    curve = [
        {"update": u + 1, "reward": 0.0, "tool_calls_per_rollout": 0.0, **({} if s is None else {"held_out": s})}
        for u, s in enumerate(curve_scores)
    ]
    sampled = {"parseable_calls": 1.0, "right_lookups": 1.0}
    return {
        "trainer": trainer,
        "seed": seed,
        "updates": len(curve),
        "episodes": 16 * len(curve),
        "after": after,
        "after_greedy": after,
        "after_detail": {"sampled": sampled, "greedy": sampled},
        "curve": curve,
        "seconds_per_update": seconds,
    }


def test_the_summary_holds_each_row_to_the_issues_targets(bench):
    assert bench.episodes_to_reach(_row("ppo-turn", 0, 0.9, [0.2, 0.6, None])) == 32
    assert bench.episodes_to_reach(_row("ppo-turn", 0, 0.9, [0.2, 0.3, None])) == 48  # only after training
    assert bench.episodes_to_reach(_row("ppo-turn", 0, 0.4, [0.2, 0.3, None])) is None
    rows = [
        _row("ppo-turn", 0, 0.9, [0.6, None], seconds=1.0),
        _row("ppo-turn", 1, 0.3, [0.1, None], seconds=2.0),
        _row("trl-grpo", 0, 0.5, [0.1, None], seconds=3.0),
    ]
    result = {"rows": rows, "eval_every": 1, "warm_start_measured": {"warm": {"sampled": {"score": 0.1}}}}
    lines = "\n".join(bench.summary_lines(result))
    # ppo-turn: mean 0.6 >= 0.5, but seed 1 gained +0.2 only; 1.5 s against TRL's 3.0 s
    assert "| ppo-turn | 0,1 | 0.600 (0.600) | +0.200 no | yes (other seeds) | 1.50 | 0.50 | 16, not reached |" in lines
    assert "| trl-grpo | 0 | 0.500 (0.500) | +0.400 yes | - | 3.00 | 1.00 | 32 |" in lines


def test_rows_that_did_not_end_are_named(bench, tmp_path):
    rows = [dict(_row("trl-grpo", 0, 0.5, [None]), trl="1.16.0"), dict(_row("grpo", 0, 0.5, [None]), trl="1.12.0")]
    result = {
        "held_out_prompts": 2,
        "rows": rows,
        "failed": [],
        "planned": [["ppo-turn", 0], ["trl-grpo", 0]],
        "stopped": "the call's time ran out",
        "last_logged": [{"trainer": "ppo-turn", "seed": 0, "line": "update 3 reward 0.1"}],
        "command": "multi_turn.py",
        "machine": {},
    }
    bench.write_table(result, tmp_path / "table")
    table = (tmp_path / "table.md").read_text()
    assert "Did not end before the run stopped (the call's time ran out): ppo-turn seed 0." in table
    assert "- ppo-turn seed 0, its last logged update: `update 3 reward 0.1`" in table
    assert "trl 1.12.0 (grpo), 1.16.0 (trl-grpo)" in table.splitlines()[0]  # each row's own TRL


def test_evaluating_gives_back_the_random_state_and_train_mode():
    import torch

    policy = torch.nn.Linear(2, 2)
    policy.train()
    torch.manual_seed(3)
    state = torch.random.get_rng_state()
    with evaluating(policy) as evaluated:
        assert not evaluated.training
        torch.rand(5)  # an evaluation that samples
    assert policy.training and torch.equal(torch.random.get_rng_state(), state)
    policy.eval()
    with evaluating(policy):
        pass
    assert not policy.training  # as it was, not always train


def _timed(row, invocation):
    return dict(row, invocation=invocation)


def test_issue_51_judgement_holds_ppo_to_the_better_group_row_and_trls_seeds(bench):
    rows = [
        _timed(_row("ppo-final-kl0", 6, 0.7, [None], seconds=12.0), "a"),
        _timed(_row("grpo", 6, 0.6, [None], seconds=10.0), "a"),
        _timed(_row("trl-grpo-default", 6, 0.5, [None], seconds=20.0), "a"),
        _timed(_row("ppo-final-kl0", 7, 0.2, [None], seconds=13.0), "b"),
        _timed(_row("grpo", 7, 0.5, [None], seconds=10.0), "b"),
        _timed(_row("trl-grpo-default", 7, 0.3, [None], seconds=20.0), "b"),
    ]
    lines = "\n".join(bench.critic_lines({"split": "test", "rows": rows}))
    assert "| ppo-final-kl0 >= grpo (the better GRPO row) on the mean, seeds 6,7 | 0.450 vs 0.550 | no |" in lines
    assert "| ppo-final-kl0 ahead of trl-grpo-default on at least 2 of 2 seeds | 1 | no |" in lines  # 3 of 4
    assert "| ppo-final-kl0 s/update <= 1.25x grpo's, invocation a | 1.20x | yes |" in lines
    assert "| ppo-final-kl0 s/update <= 1.25x grpo's, invocation b | 1.30x | no |" in lines  # never across
    assert bench.critic_lines({"split": "test", "rows": rows[1:3]}) == []  # no issue-51 PPO row: no verdict


def test_issue_51_selection_needs_the_margin_and_most_seeds(bench):
    rows = [_row("ppo-final-kl0", s, 0.5, [None]) for s in (0, 1, 2)]
    rows += [_row("ppo-final-combination", s, a, [None]) for s, a in ((0, 0.6), (1, 0.6), (2, 0.4))]
    rows += [_row("ppo-final-positive-lm", s, a, [None]) for s, a in ((0, 0.9), (1, 0.4), (2, 0.4))]
    lines = "\n".join(bench.critic_lines({"split": "heldout", "rows": rows}))
    assert (
        "| ppo-final-combination wins over ppo-final-kl0" in lines
        and "0.533 vs 0.500 (+0.033), ahead on 2 of 3 | yes |" in lines
    )
    assert "0.567 vs 0.500 (+0.067), ahead on 1 of 3 | no |" in lines  # a higher mean from one seed is no win
    rows = [r for r in rows if r["trainer"] == "ppo-final-kl0"]
    rows += [_row("ppo-final-decoupled-gae", s, 0.51, [None]) for s in (0, 1, 2)]
    lines = "\n".join(bench.critic_lines({"split": "heldout", "rows": rows}))
    assert "0.510 vs 0.500 (+0.010), ahead on 3 of 3 | no |" in lines  # ahead everywhere, by less than the margin


def test_issue_51_critic_adapter_keeps_up_with_the_shared_head_within_the_margin(bench):
    rows = [_row("ppo-final-kl0", s, a, [None]) for s, a in ((6, 0.6), (7, 0.2), (8, 0.9))]
    rows += [_row("ppo-final-critic-adapter", s, a, [None]) for s, a in ((6, 0.5), (7, 0.25), (8, 0.8))]
    line = "| ppo-final-critic-adapter learns at least ppo-final-kl0's: mean >= ppo-final-kl0's - 0.05, seeds 6,7,8 |"
    lines = "\n".join(bench.critic_lines({"split": "test", "rows": rows}))
    assert f"{line} 0.517 vs 0.567 (-0.050), ahead on 1 of 3 | yes |" in lines  # at the margin: met
    rows[3]["after"] = 0.49
    lines = "\n".join(bench.critic_lines({"split": "heldout", "rows": rows}))
    assert f"{line} 0.513 vs 0.567 (-0.053), ahead on 1 of 3 | no |" in lines
    assert bench.settings_of("ppo-final-critic-adapter")["critic_adapter"] is True


def test_merging_invocations_keeps_each_rows_invocation_and_refuses_a_mismatch(bench):
    def result(seeds, invocation, **over):
        rows = [_timed(_row("grpo", s, 0.5, [None]), invocation) for s in seeds]
        base = {"updates": 20, "split": "test", "held_out_prompts": 32, "settings": {"a": 1}, "seeds": seeds}
        return {**base, "command": f"run {invocation}", "invocations": [invocation], "rows": rows, **over}

    merged = bench.merge_results([result([6, 7], "a"), result([8, 9], "b")], "merge")
    assert merged["seeds"] == [6, 7, 8, 9] and merged["commands"] == ["run a", "run b"]
    assert [r["invocation"] for r in merged["rows"]] == ["a", "a", "b", "b"] and merged["invocations"] == ["a", "b"]
    with pytest.raises(ValueError, match="differ in \\['updates'\\]"):
        bench.merge_results([result([6], "a"), result([8], "b", updates=10)], "merge")
    alone = result([6], "c", row_settings={"trl-grpo-default": {"kl_coef": 0.0}})  # a row again, in its own
    both = bench.merge_results([result([7], "a", row_settings={"grpo": {"kl_coef": 0.0}}), alone], "merge")
    assert both["row_settings"] == {"grpo": {"kl_coef": 0.0}, "trl-grpo-default": {"kl_coef": 0.0}}
    with pytest.raises(ValueError, match="grpo's settings"):
        bench.merge_results(
            [result([6], "a", row_settings={"grpo": {"kl_coef": 0.0}}), result([8], "b", row_settings={"grpo": {}})],
            "merge",
        )
    with pytest.raises(ValueError, match="measured twice"):
        bench.merge_results([result([6], "a"), result([6], "b")], "merge")


def test_a_seeds_rows_come_from_one_warm_start(bench, tmp_path):
    def result(trainer, seed, invocation, warm):
        rows = [_timed(_row(trainer, seed, 0.5, [None]), invocation)]
        base = {"updates": 20, "split": "test", "held_out_prompts": 32, "settings": {}, "seeds": [seed]}
        return {**base, "command": "run", "invocations": [invocation], "rows": rows, "warm_start_sha256": warm}

    merged = bench.merge_results([result("grpo", 6, "a", None), result("grpo", 7, "b", "f00d")], "merge")
    assert merged["warm_starts"] == {"a": None, "b": "f00d"} and "warm_start_sha256" not in merged
    scored = {"warm": {"greedy": {"score": 0.0, "seconds": 17.2}}}
    again = dict(result("grpo", 7, "b", "f00d"), warm_start_measured={"warm": {"greedy": {"score": 0.0, "seconds": 9}}})
    assert bench.merge_results([dict(result("grpo", 6, "a", None), warm_start_measured=scored), again], "merge")
    worse = {"warm": {"greedy": {"score": 0.1, "seconds": 17.2}}}
    with pytest.raises(ValueError, match="warm_start_measured"):
        bench.merge_results([dict(result("grpo", 6, "a", None), warm_start_measured=worse), again], "merge")
    with pytest.raises(ValueError, match="seeds \\[7\\] have rows from different warm starts"):
        bench.merge_results([result("grpo", 7, "a", "beef"), result("trl-grpo", 7, "b", "f00d")], "merge")
    merged_again = bench.merge_results([merged, result("trl-grpo", 7, "c", "f00d")], "merge")  # a merged result
    assert merged_again["warm_starts"] == {"a": None, "b": "f00d", "c": "f00d"}
    # a seed whose rows mix warm starts is left out by naming the others: their rows alone are merged
    first, rebuilt = result("grpo", 6, "a", None), result("ppo", 6, "b", "f00d")
    rebuilt["rows"].append(_timed(_row("ppo", 7, 0.5, [None]), "b"))
    rebuilt.update(seeds=[6, 7], planned=[["ppo", 6], ["ppo", 7]])
    with pytest.raises(ValueError, match="seeds \\[6\\] have rows from different warm starts"):
        bench.merge_results([first, rebuilt], "merge")
    cut = bench.merge_results([first, rebuilt], "merge", seeds=[7])
    assert [(r["trainer"], r["seed"]) for r in cut["rows"]] == [("ppo", 7)]
    assert cut["seeds"] == [7] and cut["planned"] == [["ppo", 7]]
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors weights"):
        bench.warm_start_identity(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    assert bench.warm_start_identity(tmp_path) == hashlib.sha256(b"weights").hexdigest()


def test_a_merged_result_renders_a_rerun_once_and_no_cross_invocation_ratio(bench, tmp_path):
    def result(rows, invocation, failed=(), jobs=2):
        return {
            "updates": 1,
            "split": "test",
            "held_out_prompts": 2,
            "settings": {"a": 1},
            "seeds": sorted({r["seed"] for r in rows} | {f["seed"] for f in failed}),
            "command": f"run {invocation}",
            "invocations": [invocation],
            "machine": {},
            "jobs": jobs,
            "plan": {"path": "plan.md", "sha256": invocation * 4},
            "rows": [_timed(r, invocation) for r in rows],
            "failed": list(failed),
            "planned": [[r["trainer"], r["seed"]] for r in rows] + [[f["trainer"], f["seed"]] for f in failed],
        }

    killed = {"trainer": "trl-grpo", "seed": 6, "returncode": -9, "error": "update 10"}
    first = result([_row("grpo", 6, 0.5, [None], seconds=2.0)], "a", failed=[killed])
    again = result([_row("trl-grpo", 6, 0.4, [None], seconds=9.0)], "b", jobs=1)
    merged = bench.merge_results([first, again], "merge")
    assert merged["failed"] == [] and merged["reruns"] == [killed]
    assert merged["jobs"] == {"a": 2, "b": 1} and set(merged["plans"]) == {"a", "b"}
    bench.write_table(merged, tmp_path / "merged")
    table = (tmp_path / "merged.md").read_text()
    assert "Run again in a later invocation: trl-grpo seed 6 (exit -9, killed by signal 9" in table
    assert "Not measured" not in table and "Did not end" not in table
    assert "| grpo | 6 | 0.500 (0.500) | - | yes | 2.00 | - | 16 |" in table  # 2.0 / 9.0 across invocations: none
