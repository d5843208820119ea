"""benchmarks/real_model.py's own logic on a tiny chat checkpoint: a held-out score taken in the middle of a run
leaves the run as it was, and settings given on the command line win over a row's; and its plans (issue 40): the
committed plan's pairs are equal where both trainers can express a setting, the reader refuses what cannot run as
written, the pairs' differing keys and per-invocation time ratios, and a plan run end to end with stand-in rows."""

import importlib
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_qwen2

from benchmarks import harness

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def bench(monkeypatch):
    import benchmarks.real_model

    module = importlib.reload(benchmarks.real_model)  # OVERRIDES and SETTINGS as the file sets them
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
    assert bench.settings_of("scratch-grpo") == dict(
        bench.SETTINGS, kl_coef=0.0, scale_rewards="none", whiten_advantages=True
    )


def test_collect_writes_results_with_a_setting_given_on_the_command_line(bench, tmp_path, monkeypatch):
    import json

    row = {
        "trainer": "scratch-ppo",
        "seed": 0,
        "episodes": 16,
        "before": 0.1,
        "after": 0.5,
        "before_greedy": 0.1,
        "after_greedy": 0.5,
        "seconds_per_update": 1.0,
        "peak_rss_mib": 1.0,
        "device": "cpu",
        "settings": dict(bench.SETTINGS, whiten_advantages=False),
        "curve": [
            {"update": 1, "seconds": 1.0, "reward": 0.2, "held_out": 0.3},
            {"update": 2, "seconds": 2.0, "reward": 0.4},
        ],
    }
    (tmp_path / "row.json").write_text(json.dumps(row))
    monkeypatch.setattr(sys, "argv", ["real_model.py"])
    assert (
        bench.main(
            ["--set", "learning_rate=2e-4", "--collect", str(tmp_path / "row.json"), "--out", str(tmp_path / "out")]
        )
        == 0
    )
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["settings"]["learning_rate"] == 2e-4 and written["rows"] == [row]
    assert written["row_settings"] == {"scratch-ppo": {"whiten_advantages": False}}  # as the row recorded them
    assert "| scratch-ppo | 0 | 16 | 0.100 (0.100) | 0.500 (0.500) |" in (tmp_path / "out.md").read_text()


# ------------------------------------------------------------------------------------------- plans (issue 40)

PLAN = ROOT / "benchmarks" / "plans" / "real-model-fair.json"
SEEDS_RUN_BEFORE = set(range(8)) | {17}  # CPU seeds 0-3, the H100's 0-7, the seed-17 re-run of issue 40


def _resolved(bench, plan):
    return {
        name: bench.resolved_settings(row["kind"], row["settings"], plan["updates"])[0]
        for name, row in plan["rows"].items()
    }


def test_the_committed_plan_is_equal_where_both_can_express_and_judged_on_fresh_ground(bench):
    plan = bench.read_plan(PLAN)
    assert plan["split"] == "test" and plan["eval_prompts"] == 240 and plan["updates"] == 20 and plan["jobs"] == 2
    assert len(plan["seeds"]) >= 6 and not set(plan["seeds"]) & SEEDS_RUN_BEFORE
    settings = _resolved(bench, plan)
    pairs = {tuple(pair["rows"]): pair for pair in plan["pairs"]}
    assert set(pairs) == {
        ("scratch-ppo", "trl-ppo"),
        ("scratch-grpo-group", "trl-grpo-group"),
        ("scratch-grpo-none", "trl-grpo-none"),
    }
    for (a, b), pair in pairs.items():  # computed from the settings each trainer runs, TRL's fixed values included
        assert harness.settings_differences(settings[a], settings[b]) == {} == dict.fromkeys(pair["differs_in"])
    assert settings["scratch-ppo"]["whiten_advantages"] is True and settings["trl-ppo"]["whiten_advantages"] is True
    assert {settings[n]["scale_rewards"] for n in ("scratch-grpo-group", "trl-grpo-group")} == {"group"}
    assert {settings[n]["scale_rewards"] for n in ("scratch-grpo-none", "trl-grpo-none")} == {"none"}
    extra = plan["extras"]["scratch-ppo-unwhitened"]
    differ = harness.settings_differences(settings["scratch-ppo-unwhitened"], settings[extra["compare_with"]])
    assert differ == {"whiten_advantages": [False, True]} and extra["differs_in"] == ["whiten_advantages"]
    assert "only one side has" in extra["about"]
    # every row's settings are the plan's alone: a changed default in this benchmark would not move them
    assert all(set(bench.SETTINGS) <= set(row["settings"]) for row in plan["rows"].values())


@pytest.mark.parametrize("name", ["critic-number-select", "critic-number-combination-select", "critic-number-judge"])
def test_the_critic_plans_add_only_what_they_declare_at_the_grpo_rows_kl(bench, name):
    """Issue 51's number-task plans: every extra is the row it is compared with plus exactly its declared settings,
    every row without a KL term (as the GRPO rows), selection on the held-out split and judgement on the test split
    with seeds never run on this task."""
    plan = bench.read_plan(ROOT / "benchmarks" / "plans" / f"{name}.json")
    assert plan["updates"] == 20
    if name.endswith("-select"):
        assert plan["split"] == "heldout"
    else:
        run_before = SEEDS_RUN_BEFORE | set(range(10, 16)) | set(range(20, 28))  # and the fair plans' seeds
        assert plan["split"] == "test" and len(plan["seeds"]) >= 6 and not set(plan["seeds"]) & run_before
    settings = _resolved(bench, plan)
    assert {row["kl_coef"] for row in settings.values()} == {0.0}
    assert settings["ppo"]["advantage_estimator"] == "gae" and settings["grpo"]["advantage_estimator"] == "grpo"
    for row, extra in plan["extras"].items():
        differ = harness.settings_differences(settings[row], settings[extra["compare_with"]])
        assert extra["compare_with"] == "ppo" and set(differ) == set(extra["differs_in"]), row


def test_the_plain_run_leaves_out_the_rows_only_a_plan_names(bench):
    assert set(bench.PLAIN_ROWS) < set(bench.ROWS) and "scratch-ppo-gen4" not in bench.PLAIN_ROWS


def _plan_file(tmp_path, **changes):
    plan = json.loads(PLAN.read_text())
    for key, value in changes.items():
        if value is None:
            plan.pop(key)
        else:
            plan[key] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def test_the_plan_reader_refuses_a_plan_that_cannot_run_as_written(bench, tmp_path):
    plan = json.loads(PLAN.read_text())
    trl_ppo = plan["rows"]["trl-ppo"]
    unwhitened_trl = dict(
        plan["rows"], **{"trl-ppo": dict(trl_ppo, settings=dict(trl_ppo["settings"], whiten_advantages=False))}
    )
    lonely = dict(plan["rows"], **{"lonely": {"kind": "scratch-ppo"}})
    common = {k: v for k, v in plan["settings"].items() if k != "learning_rate"}
    cases = {
        "unknown keys ['colour']": dict(colour="blue"),
        "missing keys ['seeds']": dict(seeds=None),
        "split 'dev'": dict(split="dev"),
        "seeds must be distinct": dict(seeds=[10, 10]),
        "eval_prompts 500 is more": dict(eval_prompts=500),
        "missing ['learning_rate']": dict(settings=common),
        "cannot run ([asked, runs]): {'whiten_advantages': [False, True]}": dict(rows=unwhitened_trl),
        "exactly one pair or be an extra": dict(rows=lonely),
        "each pair names two rows": dict(pairs=[{"rows": ["scratch-ppo"]}] + plan["pairs"][1:]),
    }
    for message, change in cases.items():
        with pytest.raises(bench.PlanError, match=re.escape(message)):
            bench.read_plan(_plan_file(tmp_path, **change))
    with pytest.raises(bench.PlanError, match="row 'scratch-ppo': .*cliprange"):  # PPOConfig's own check, named
        rows = dict(plan["rows"], **{"scratch-ppo": {"kind": "scratch-ppo", "settings": {"cliprange": -1}}})
        bench.read_plan(_plan_file(tmp_path, rows=rows))


def test_a_plan_runs_as_written_its_pairs_side_by_side_in_one_invocation(bench, tmp_path, monkeypatch, capsys):
    """The plan path end to end with each row's subprocess replaced by a stand-in that writes what a row writes
    (its settings resolved by the same function a row uses): the job order, one invocation id, the results'
    comparisons, a failed row listed, and the flags a plan refuses."""
    launched = []

    def fake_launch(cmd, log):
        arg = dict(zip(cmd[2::2], cmd[3::2]))  # python, script, then --flag value pairs
        name, seed = arg["--row"], int(arg["--seeds"])
        launched.append((name, seed, arg["--invocation"], arg["--plan"], arg["--updates"], arg["--heldout"]))
        if name == "trl-grpo-none":
            log.write_text("error: a row that failed\n")
            return 1
        plan = bench.read_plan(arg["--plan"])
        spec = plan["rows"][name]
        settings = bench.resolved_settings(spec["kind"], spec["settings"], int(arg["--updates"]))[0]
        seconds = {"scratch": 10.0, "trl": 40.0, "grpo": 20.0}[bench.ROWS[spec["kind"]][1]]
        Path(arg["--row-out"]).write_text(
            json.dumps(
                {
                    "trainer": name,
                    "kind": spec["kind"],
                    "seed": seed,
                    "invocation": arg["--invocation"],
                    "episodes": 32,
                    "before": 0.1,
                    "after": 0.2,
                    "before_greedy": 0.1,
                    "after_greedy": 0.2,
                    "seconds_per_update": seconds,
                    "update1_kl": 0.0,
                    "peak_rss_mib": 1.0,
                    "settings": settings,
                    "held_out_prompts": 16,
                    "split": "test",
                    "curve": [
                        {"update": 1, "seconds": seconds, "reward": 0.1},
                        {"update": 2, "seconds": 2 * seconds, "reward": 0.2},
                    ],
                }
            )
        )
        return 0

    monkeypatch.setattr(harness, "launch_row", fake_launch)
    monkeypatch.setattr(sys, "argv", ["real_model.py"])
    out = tmp_path / "fair"
    assert bench.main(["--plan", str(PLAN), "--quick", "--out", str(out)]) == 0
    plan = bench.read_plan(PLAN)
    jobs = harness.plan_jobs(plan, plan["seeds"][:1])
    assert jobs[:2] == [("scratch-ppo", 10), ("trl-ppo", 10)]  # a pair's rows next to each other: started together
    # every job launched once (two workers start them in the jobs' order, but which of two starting together
    # records first is the scheduler's)
    assert sorted((n, s) for n, s, *_ in launched) == sorted(jobs)
    assert len({inv for _, _, inv, *_ in launched}) == 1 and {x[3:] for x in launched} == {(str(PLAN), "2", "16")}
    written = json.loads(out.with_suffix(".json").read_text())
    invocation = launched[0][2]
    assert written["invocation"] == invocation and written["split"] == "test" and written["quick"]
    assert written["plan"]["sha256"] == plan["sha256"] and written["plan"]["path"].endswith("real-model-fair.json")
    assert [f["trainer"] for f in written["failed"]] == ["trl-grpo-none"] and len(written["rows"]) == 6
    assert all({"started", "ended", "alone"} <= set(r["wall"]) for r in written["rows"])
    by = {tuple(c["rows"]): c for c in written["comparisons"]}
    ppo = by["scratch-ppo", "trl-ppo"]
    assert ppo["differing_settings"] == {} and ppo["as_declared"] and ppo["kind"] == "pair"
    assert ppo["invocations"] == [
        {
            "invocation": invocation,
            "seconds_per_update": {"scratch-ppo": 10.0, "trl-ppo": 40.0},
            "ratio": 0.25,
            "seeds": {"scratch-ppo": [10], "trl-ppo": [10]},
            "averaged": [10],
            "per_seed": {"10": 0.25},
        }
    ]
    assert by["scratch-grpo-none", "trl-grpo-none"]["seeds"] == []  # its TRL row failed: nothing compared
    extra = by["scratch-ppo-unwhitened", "trl-ppo"]
    assert extra["kind"] == "extra" and extra["differing_settings"] == {"whiten_advantages": [False, True]}
    assert extra["as_declared"]
    md = out.with_suffix(".md").read_text()
    assert "| scratch-ppo vs trl-ppo | pair | 10 | " in md and "| none | none | " in md and "= 0.25x" in md
    assert f"| scratch-ppo s/update <= 0.7x trl-ppo's, invocation {invocation} | 0.25x | yes |" in md  # the targets
    assert "whiten_advantages (False / True)" in md and "| trl-grpo-none | 10 | failed (exit" in md

    # the rows of several invocations, collected: a ratio per invocation
    rows = written["rows"] + [
        dict(r, invocation="later", seconds_per_update=r["seconds_per_update"] * 2)
        for r in written["rows"]
        if r["trainer"] in ("scratch-ppo", "trl-ppo")
    ]
    files = []
    for i, r in enumerate(rows):
        files.append(tmp_path / f"row{i}.json")
        files[-1].write_text(json.dumps(r))
    assert bench.main(["--plan", str(PLAN), "--collect", *map(str, files), "--out", str(tmp_path / "both")]) == 0
    both = {tuple(c["rows"]): c for c in json.loads((tmp_path / "both.json").read_text())["comparisons"]}
    assert [(i["invocation"], i["ratio"]) for i in both["scratch-ppo", "trl-ppo"]["invocations"]] == [
        (invocation, 0.25),
        ("later", 0.25),
    ]

    for flags, message in (
        (["--set", "learning_rate=1e-3"], "--set cannot change it"),
        (["--jobs", "4"], "--jobs cannot change it"),
        (["--updates", "3"], "--updates"),
        (["--rows", "scratch-ppo"], "takes whole pairs"),
        (["--seeds", "3"], "some of the plan's"),
    ):
        with pytest.raises(SystemExit):
            bench.main(["--plan", str(PLAN), *flags])
        assert message in capsys.readouterr().err


def test_plan_targets_say_no_where_trl_ext_falls_short():
    from benchmarks.real_model_tables import plan_targets

    def row(trainer, seed, after, kl):
        return {"trainer": trainer, "kind": trainer, "seed": seed, "after": after, "update1_kl": kl}

    rows = [
        row("scratch-ppo", 1, 0.5, 0.0),
        row("trl-ppo", 1, 0.6, 0.15),
        row("scratch-ppo", 2, 0.7, 0.0),
        row("trl-ppo", 2, 0.6, 0.02),
    ]
    comparisons = [
        {
            "rows": ["scratch-ppo", "trl-ppo"],
            "kind": "pair",
            "seeds": [1, 2],
            "invocations": [{"invocation": "i1", "ratio": 0.9}],
        }
    ]
    lines = plan_targets({"rows": rows, "comparisons": comparisons})
    assert lines == [
        "| scratch-ppo >= trl-ppo on the mean | 0.600 vs 0.600 | yes |",
        "| scratch-ppo >= trl-ppo on at least 2 of 2 seeds | 1 of 2 | no |",
        "| scratch-ppo s/update <= 0.7x trl-ppo's, invocation i1 | 0.90x | no |",
        "| every PPO row's update-1 KL within 0.1 of 0 (4 rows) | largest +0.150 (trl-ppo, seed 1) | no |",
    ]


def test_selection_targets_apply_the_critic_plans_rule():
    """Issue 51's rule: a technique wins at its baseline's mean + 0.02 and ahead on more than half the seeds; a
    larger mean carried by one seed does not win."""
    from benchmarks.real_model_tables import selection_targets

    scores = {"ppo": (0.5, 0.5, 0.5), "grpo": (0.6, 0.4, 0.6), "one-seed": (0.9, 0.4, 0.4), "steady": (0.54, 0.54, 0.5)}
    rows = [{"trainer": t, "seed": s, "after": a} for t, after in scores.items() for s, a in zip((0, 1, 2), after)]
    invocation = [{"invocation": "i1", "ratio": 1.3}]
    comparisons = [
        {"rows": ["ppo", "grpo"], "kind": "pair", "seeds": [0, 1, 2], "invocations": invocation},
        {"rows": ["one-seed", "ppo"], "kind": "extra", "seeds": [0, 1, 2], "invocations": []},
        {"rows": ["steady", "ppo"], "kind": "extra", "seeds": [0, 1, 2], "invocations": []},
    ]
    lines = selection_targets({"rows": rows, "comparisons": comparisons})
    rule = "mean >= ppo's + 0.02, ahead on more than half the seeds"
    assert lines == [
        "| ppo >= grpo on the mean | 0.500 vs 0.533 | no |",
        "| ppo >= grpo on at least 2 of 3 seeds | 1 | no |",
        "| ppo s/update <= 1.25x grpo's, invocation i1 | 1.30x | no |",
        f"| one-seed wins over ppo: {rule} | 0.567 vs 0.500 (+0.067), ahead on 1 of 3 | no |",
        f"| steady wins over ppo: {rule} | 0.527 vs 0.500 (+0.027), ahead on 2 of 3 | yes |",
    ]


def test_judgement_targets_face_the_better_grpo_row_and_trl_ext_grpos_cost():
    """Issue 51's targets on fresh ground: each trl-ext PPO row against whichever GRPO row has the higher mean (here
    TRL's), on 4 of 6 seeds, and at most 1.25x trl-ext GRPO's seconds an update in the invocation."""
    from benchmarks.real_model_tables import judgement_targets

    after = {"ppo": [0.6] * 6, "grpo": [0.5] * 6, "trl-grpo": [0.7, 0.7, 0.5, 0.5, 0.5, 0.5]}
    kinds = {"ppo": "scratch-ppo", "grpo": "scratch-grpo", "trl-grpo": "trl-grpo"}
    seconds = {"ppo": 13.0, "grpo": 10.0, "trl-grpo": 30.0}
    rows = [
        {"trainer": t, "kind": kinds[t], "seed": s, "after": a, "seconds_per_update": seconds[t], "invocation": "i1"}
        for t, scores in after.items()
        for s, a in enumerate(scores)
    ]
    lines = judgement_targets({"rows": rows, "seeds": list(range(6))})
    assert lines == [
        "| ppo >= trl-grpo (the better GRPO row) on the mean, seeds 0,1,2,3,4,5 | 0.600 vs 0.567 | yes |",
        "| ppo ahead of trl-grpo on at least 4 of 6 seeds | 4 | yes |",
        "| ppo s/update <= 1.25x grpo's, invocation i1 | 1.30x | no |",
    ]


def test_a_plan_stopped_early_says_which_rows_did_not_run():
    from benchmarks.real_model_tables import _description

    plan = {"path": "benchmarks/plans/x.json", "rows": ["ppo", "grpo"]}
    data = {"plan": plan, "settings": {"jobs": 2}, "updates": 20, "held_out_prompts": 8, "seeds": [1, 2]}
    rows = [{"trainer": "ppo", "seed": 1}, {"trainer": "grpo", "seed": 1}, {"trainer": "ppo", "seed": 2}]
    assert "Stopped early**: 1 planned rows did not run (grpo seed 2)." in _description({**data, "rows": rows})
    done = rows + [{"trainer": "grpo", "seed": 2}]
    assert "Stopped early" not in _description({**data, "rows": done})


def test_the_better_grpo_row_is_chosen_on_the_seeds_both_ran():
    """A run stopped early can hold a seed of trl-ext's GRPO that TRL's lacks: the better row is chosen on the seeds
    both ran (here TRL's, 0.6 against 0.5), not on a mean one extra seed lifts (trl-ext's, 0.667 over three)."""
    from benchmarks.real_model_tables import judgement_targets

    after = {"ppo": [0.55, 0.55, 0.55], "grpo": [0.5, 0.5, 1.0], "trl-grpo": [0.6, 0.6]}
    kinds = {"ppo": "scratch-ppo", "grpo": "scratch-grpo", "trl-grpo": "trl-grpo"}
    rows = [
        {"trainer": t, "kind": kinds[t], "seed": s, "after": a, "seconds_per_update": 1.0, "invocation": "i1"}
        for t, scores in after.items()
        for s, a in enumerate(scores)
    ]
    lines = judgement_targets({"rows": rows, "seeds": [0, 1, 2]})
    assert lines[0] == "| ppo >= trl-grpo (the better GRPO row) on the mean, seeds 0,1 | 0.550 vs 0.600 | no |"
