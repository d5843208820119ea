import json
import subprocess
import sys

import pytest


def test_pretraining_loss_falls(tokenizer):
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.supervised import supervised_loop
    from trl_ext.tasks.doubling.task import pretrain_dataset

    model = build_policy(tokenizer)
    assert sum(p.numel() for p in model.parameters()) == 210_944
    data = pretrain_dataset(tokenizer, 40 * 32, seed=1)
    result = supervised_loop(
        model,
        data,
        tokenizer.pad_token_id,
        batch_size=32,
        lr=2e-3,
        warmup_steps=5,
        use_labels=False,
        seed=1,
        desc="t",
        show_progress=False,
    )
    assert sum(result.losses[-5:]) / 5 < 0.7 * sum(result.losses[:5]) / 5


def test_malformed_dataset_rows_are_named(tokenizer):
    from datasets import Dataset

    from trl_ext.tasks.doubling.models import build_classifier
    from trl_ext.tasks.doubling.supervised import supervised_loop

    model = build_classifier(tokenizer)
    rows = Dataset.from_dict({"input_ids": [[1, 2], [], [1]], "label": [0, 1, 2]})
    with pytest.raises(ValueError, match="row 1 has empty input_ids"):
        supervised_loop(model, rows, 0, batch_size=1, lr=1e-3, warmup_steps=0, use_labels=True, seed=0, desc="t")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['label'\]"):
        supervised_loop(
            model,
            rows.remove_columns("label"),
            0,
            batch_size=1,
            lr=1e-3,
            warmup_steps=0,
            use_labels=True,
            seed=0,
            desc="t",
        )


def test_default_recipes_reach_targets(trained_artifacts):
    policy = trained_artifacts["policy_metrics"]
    assert policy["value_acc"] >= 0.99
    # sampled charset choice is spread over the three sets, as in the seed
    assert all(0.2 < policy["charset_spread"][k] < 0.45 for k in ("digits", "lower", "upper"))
    assert trained_artifacts["reward_metrics"]["heldout_accuracy"] >= 0.995


def test_the_classifier_reward_gives_a_mixed_answer_no_credit(trained_artifacts):
    """A classifier trained on pure answers alone scored "10捌捌零E" for upper case within 0.2 of "壹零捌捌零E" (its
    logit), and PPO runs settled on such answers (docs/decisions.md, "Why a run settles"): its mixed class must give
    a mixed answer no more credit than a wrong set gets."""
    import random

    from trl_ext.tasks.doubling.artifacts import load_classifier
    from trl_ext.tasks.doubling.rewards import doubling_classifier_reward
    from trl_ext.tasks.doubling.task import PREFIXES, expected_answer, mixed_answer

    reward = doubling_classifier_reward(*load_classifier(trained_artifacts["reward"]))
    rng = random.Random(0)
    for label in range(3):
        questions = [rng.randrange(1000, 10000) for _ in range(50)]
        prompts = [f"S{PREFIXES[label]}:{q}x2=" for q in questions]
        right = reward(prompts=prompts, completions=[expected_answer(q, label) for q in questions])
        mixed = reward(prompts=prompts, completions=[mixed_answer(q, label, rng) for q in questions])
        assert sum(right) / len(right) > 0.9 and sum(mixed) / len(mixed) < 0.2, (PREFIXES[label], right, mixed)


def test_artifacts_reload(trained_artifacts):
    from trl_ext.tasks.doubling.artifacts import load_classifier, load_policy

    model, tok = load_policy(trained_artifacts["policy"])
    assert tok.padding_side == "left" and model.config.vocab_size == 42
    clf, _ = load_classifier(trained_artifacts["reward"])
    assert clf.config.num_labels == 4


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "trl_ext.commands.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )


def test_cli_end_to_end_tiny(tmp_path):
    cfg = tmp_path / "pre.yaml"
    cfg.write_text("steps: 30\nbatch_size: 16\neval_n: 20\n")
    run = _cli("pretrain", "--out", str(tmp_path / "p"), "--config", str(cfg), "--seed", "1")
    assert run.returncode == 0, run.stderr
    assert "pretrain: value_acc=" in run.stdout
    saved = json.loads((tmp_path / "p" / "metrics.json").read_text())
    assert saved["config"]["steps"] == 30 and saved["config"]["seed"] == 1
    run = _cli("train-reward", "--out", str(tmp_path / "r"), "--steps", "10", "--eval-n", "20")
    assert run.returncode == 0, run.stderr
    run = _cli("eval", "--policy", str(tmp_path / "p"), "--n", "5", "--sample")
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "p" / "eval.json").read_text())
    # the exact rates, recounted from the saved answers (all five prompts): the answer up to its first E
    from trl_ext.tasks.doubling.artifacts import load_policy
    from trl_ext.tasks.doubling.task import eval_prompt_dataset

    data = eval_prompt_dataset(load_policy(tmp_path / "p")[1], 5, 0)
    for mode in ("greedy", "sampled"):
        shown = report[mode]["examples"]
        assert [e[: len(p)] for e, p in zip(shown, data["prompt"], strict=True)] == data["prompt"]
        right = [e[len(p) :].startswith(a) for e, p, a in zip(shown, data["prompt"], data["answer"])]
        assert report[mode]["exact"] == sum(right) / 5, (mode, shown)


@pytest.mark.parametrize(
    "args, message",
    [
        (["eval", "--policy", "/nonexistent/dir"], "does not exist"),
        (["pretrain", "--out", "x", "--config", "CFG"], "unknown option 'stepz' (did you mean steps?)"),
        (["pretrain", "--out", "x", "--steps", "0"], "steps must be positive"),
        (["eval", "--policy", "REWARD_DIR"], "not a causal LM"),
    ],
)
def test_cli_bad_input_gives_one_line_error(tmp_path, args, message):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("stepz: 3\n")
    reward_dir = tmp_path / "rd"
    reward_dir.mkdir()
    (reward_dir / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    (reward_dir / "model.safetensors").write_bytes(b"")
    args = [str(cfg) if a == "CFG" else str(reward_dir) if a == "REWARD_DIR" else a for a in args]
    run = _cli(*args, cwd=tmp_path)
    assert run.returncode == 2
    assert message in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_flags_are_never_abbreviated(tmp_path, capsys):
    """`--step 2` used to be taken for `--steps` and then lose to the YAML's value, silently."""
    from trl_ext.commands.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("steps: 5\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["pretrain", "--out", str(tmp_path / "p"), "--config", str(cfg), "--step", "2"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --step 2" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_yaml_values_take_the_field_type_or_name_the_key(tmp_path):
    import argparse

    from trl_ext.commands.parsing import ConfigError, add_command_arguments, build_options
    from trl_ext.commands.stages import PRETRAIN

    parser = argparse.ArgumentParser()
    add_command_arguments(parser, PRETRAIN)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("out: runs/p\nlr: 1e-3\nsteps: '40'\n")  # YAML reads 1e-3 as the string '1e-3'
    built = build_options(PRETRAIN, parser.parse_args(["--config", str(cfg)])).stage
    assert built.lr == 1e-3 and isinstance(built.lr, float) and built.steps == 40
    cfg.write_text("out: runs/p\nsteps: many\n")
    with pytest.raises(ConfigError, match="option 'steps': 'many' is not a valid int"):
        build_options(PRETRAIN, parser.parse_args(["--config", str(cfg)]))
    cfg.write_text("out: runs/p\nsteps: 2.5\n")
    with pytest.raises(ConfigError, match="option 'steps': 2.5 is not a valid int"):
        build_options(PRETRAIN, parser.parse_args(["--config", str(cfg)]))
