"""benchmarks/harness.py, what the row-running benchmarks share: invocation ids that differ and sort by time, the
settings two rows differ in, time ratios only within an invocation, a row's time alone, a plan's placement of rows,
and the results JSON written together with the table rendered from it."""

import json

import pytest

from benchmarks import harness


def test_invocation_ids_are_unique_and_sort_by_when_they_were_made(monkeypatch):
    ids = {harness.new_invocation_id() for _ in range(200)}
    assert len(ids) == 200
    made = []
    for clock in ("20261101T090000", "20261101T100000", "20261102T080000"):
        monkeypatch.setattr(harness.time, "strftime", lambda _fmt, clock=clock: clock)
        made.append(harness.new_invocation_id())
    assert sorted(made) == made and all(len(i) == len("20261101T090000-abcdef") for i in made)


def test_settings_differences_name_every_key_either_side_sets_otherwise():
    a = {"lr": 1e-4, "whiten": True, "only_a": 1, "same": None}
    b = {"lr": 2e-4, "whiten": True, "only_b": None, "same": None}
    assert harness.settings_differences(a, b) == {
        "lr": [1e-4, 2e-4],
        "only_a": [1, "<absent>"],
        "only_b": ["<absent>", None],
    }
    assert harness.settings_differences(a, dict(a)) == {}


def test_time_ratios_are_per_invocation_and_never_across():
    def row(trainer, seed, invocation, seconds):
        return {"trainer": trainer, "seed": seed, "invocation": invocation, "seconds_per_update": seconds}

    rows = [
        row("ours", 10, "A", 10.0),
        row("theirs", 10, "A", 40.0),
        row("ours", 11, "A", 12.0),
        row("theirs", 11, "B", 30.0),
        row("ours", 12, "B", 15.0),
        row("theirs", 12, "B", 30.0),
        row("ours", 13, None, 1.0),
        row("theirs", 13, None, 100.0),
    ]  # no invocation recorded: left out
    found = harness.invocation_ratios(rows, "ours", "theirs")
    assert [f["invocation"] for f in found] == ["A", "B"]
    a, b = found
    # seed 11's rows ran in two invocations: in no ratio and in neither mean (like for like)
    assert a["seconds_per_update"] == {"ours": 10.0, "theirs": 40.0} and a["ratio"] == 0.25
    assert a["per_seed"] == {"10": 0.25} and a["seeds"] == {"ours": [10, 11], "theirs": [10]} and a["averaged"] == [10]
    assert b["seconds_per_update"] == {"ours": 15.0, "theirs": 30.0} and b["ratio"] == 0.5
    assert b["per_seed"] == {"12": 0.5} and b["seeds"] == {"ours": [12], "theirs": [11, 12]}


def test_a_rows_time_alone_is_what_no_other_row_covers():
    wall = {"started": 0.0, "ended": 100.0}
    assert harness.alone_seconds(wall, []) == 100.0
    assert harness.alone_seconds(wall, [{"started": 0.0, "ended": 60.0}, {"started": 50.0, "ended": 90.0}]) == 10.0
    assert harness.alone_seconds(wall, [{"started": -5.0, "ended": 200.0}]) == 0.0
    assert harness.alone_seconds(wall, [{"started": 20.0, "ended": 30.0}, {"started": 150.0, "ended": 160.0}]) == 90.0


def test_comparisons_compute_the_differing_settings_of_each_pair_and_extra():
    plan = {
        "pairs": [{"rows": ["a", "b"], "differs_in": []}],
        "extras": {"c": {"compare_with": "b", "about": "only one side has it", "differs_in": ["lr"]}},
    }

    def row(trainer, seed, lr):
        return {
            "trainer": trainer,
            "seed": seed,
            "invocation": "I",
            "seconds_per_update": 1.0,
            "settings": {"lr": lr, "epochs": 2},
        }

    found = {tuple(c["rows"]): c for c in harness.comparisons([row("a", 0, 1), row("b", 0, 1), row("c", 0, 2)], plan)}
    assert found["a", "b"]["differing_settings"] == {} and found["a", "b"]["as_declared"]
    assert found["c", "b"]["differing_settings"] == {"lr": [2, 1]} and found["c", "b"]["kind"] == "extra"
    assert found["c", "b"]["as_declared"] and found["c", "b"]["invocations"][0]["ratio"] == 1.0


def test_a_plan_places_every_row_once_and_runs_a_pairs_rows_together(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"rows": {}, "seeds": [1]}))
    plan = harness.read_plan_file(path, {"rows", "seeds", "pairs"}, {"rows", "seeds"})
    assert plan["path"] == str(path) and len(plan["sha256"]) == 64
    with pytest.raises(harness.PlanError, match=r"unknown keys \[\], missing keys \['pairs'\]"):
        harness.read_plan_file(path, {"rows", "seeds", "pairs"}, {"pairs"})
    pairs, extras = [{"rows": ["a", "b"]}], {"c": {"compare_with": "a", "about": "why"}}
    harness.check_pairs_and_extras(path, pairs, extras, ["a", "b", "c"])
    with pytest.raises(harness.PlanError, match="exactly one pair or be an extra"):
        harness.check_pairs_and_extras(path, pairs, {}, ["a", "b", "c"])
    plan = {"rows": {"a": {}, "b": {}, "c": {}}, "pairs": pairs, "extras": extras}
    assert harness.plan_jobs(plan, [0, 1], ["a", "b", "c"]) == [
        ("a", 0),
        ("b", 0),
        ("c", 0),
        ("a", 1),
        ("b", 1),
        ("c", 1),
    ]


def test_the_results_json_and_its_table_are_written_together_from_the_file(tmp_path):
    data = {"rows": [{"name": "ünï", "pair": ("a", 1)}]}
    seen = []

    def render(written):
        seen.append(written)
        return f"| {written['rows'][0]['name']} | {written['rows'][0]['pair']} |\n\n"

    written = harness.write_results(tmp_path / "out" / "r.json", data, render)
    assert seen == [written] and written["rows"][0]["pair"] == ["a", 1]  # rendered from the JSON as written
    assert (tmp_path / "out" / "r.json").read_text() == json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    assert (tmp_path / "out" / "r.md").read_text() == "| ünï | ['a', 1] |\n"  # one newline at the end
    (tmp_path / "out" / "r.md").unlink()
    harness.rewrite_table(tmp_path / "out" / "r.json", render)
    assert (tmp_path / "out" / "r.md").read_text() == "| ünï | ['a', 1] |\n"


def test_a_merged_result_merges_again_keeping_each_invocations_plan_jobs_and_failures():
    from benchmarks.harness import merge_invocations

    def result(invocation, rows, failed=(), jobs=2):
        return dict(
            mode="train",
            command=f"run {invocation}",
            invocation=invocation,
            plan={"sha256": invocation},
            jobs=jobs,
            wall_seconds=10.0,
            rows=[{"trainer": t, "seed": s, "invocation": invocation} for t, s in rows],
            failed=[{"trainer": t, "seed": s, "error": "killed"} for t, s in failed],
        )

    def identity(row):
        return row["trainer"], row["seed"]

    first = merge_invocations(
        [result("a", [("ppo", 1)], failed=[("grpo", 1)]), result("b", [("ppo", 2)])], "m", ("mode",), identity
    )
    assert first["failed"] == [{"trainer": "grpo", "seed": 1, "error": "killed"}] and first["reruns"] == []
    again = merge_invocations([first, result("c", [("grpo", 1)], jobs=1)], "m2", ("mode",), identity)
    assert again["invocations"] == ["a", "b", "c"] and again["commands"] == ["run a", "run b", "run c"]
    assert again["plans"] == {i: {"sha256": i} for i in "abc"} and again["jobs"] == {"a": 2, "b": 2, "c": 1}
    assert again["wall_seconds"] == [10.0, 10.0, 10.0]
    assert again["failed"] == [] and again["reruns"] == [{"trainer": "grpo", "seed": 1, "error": "killed"}]
    rerun_kept = merge_invocations([again, result("d", [("ppo", 3)])], "m3", ("mode",), identity)
    assert rerun_kept["reruns"] == again["reruns"] and rerun_kept["failed"] == []  # a merged input's reruns stay
    before_ids = {k: v for k, v in result("e", [("ppo", 4)]).items() if k not in ("invocation", "plan", "jobs")}
    assert merge_invocations([before_ids, result("f", [("ppo", 5)])], "m", ("mode",), identity)["invocations"] == ["f"]
    with pytest.raises(ValueError, match="differ in \\['mode'\\]"):
        merge_invocations([first, dict(result("d", []), mode="select")], "m3", ("mode",), identity)
    with pytest.raises(ValueError, match="measured twice: \\[\\('ppo', 1\\)\\]"):
        merge_invocations([first, result("d", [("ppo", 1)])], "m3", ("mode",), identity)
