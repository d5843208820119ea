"""Scalar reward models from preference pairs (TRL's RewardTrainer) and what they drive."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trl_ext.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args):
    import os

    return subprocess.run(
        [sys.executable, "-m", "trl_ext", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.fixture(scope="module")
def doubling_rm(tmp_path_factory, trained_artifacts):
    """From the pretrained policy (as InstructGPT starts its reward model from the SFT model), 800 steps,
    plain Bradley-Terry (the centring term slows the pairwise accuracy at this budget: 0.93 with it)."""
    from trl_ext.tasks.doubling.stages import RewardModelConfig, run_train_reward_model

    out = tmp_path_factory.mktemp("rm") / "rm"
    config = RewardModelConfig(
        out=str(out), base=str(trained_artifacts["policy"]), steps=800, eval_n=400, center_rewards_coefficient=0
    )
    return out, run_train_reward_model(config)  # about 45 s


def test_preference_pairs_are_seeded_and_in_the_stated_proportions():
    from trl_ext.tasks.doubling.preferences import preference_dataset
    from trl_ext.tasks.doubling.task import parse_answer, parse_prompt

    data = preference_dataset(2000, seed=0)
    assert data[:5] == preference_dataset(5, seed=0)[:5]
    share = {k: data["kind"].count(k) / len(data) for k in set(data["kind"])}
    assert share == pytest.approx(
        {"wrong_value": 0.60, "other_charset": 0.15, "mixed_charset": 0.15, "missing_eos": 0.05, "truncated": 0.05},
        abs=0.03,
    )
    for row in data.filter(lambda r: r["kind"] == "mixed_charset").select(range(50)):
        used = {parse_answer(ch).charset for ch in row["rejected"][:-1]}
        assert len(row["rejected"]) == 2 or len(used) == 2, row  # two sets in one answer
    for row in data.select(range(200)):
        assert row["chosen"] != row["rejected"] and row["chosen"].endswith("E")
        assert parse_prompt(row["prompt"]).label is not None


def test_reward_model_learns_the_doubling_preferences(doubling_rm):
    """Measured (800 steps, on the exact-GELU policy): 0.9675 overall, wrong values 0.945, every other kind 1.00
    (600 steps gave 0.950 and 0.920 on it, 0.9675 on the earlier tanh-GELU policy)."""
    out, result = doubling_rm
    by_kind = result["heldout_by_kind"]
    assert result["heldout_pairwise_accuracy"] > 0.95 and result["final_loss"] < 0.5 * result["first_loss"], result
    assert set(by_kind) == {"other_charset", "wrong_value", "mixed_charset", "missing_eos", "truncated"}
    assert min(v for k, v in by_kind.items() if k != "wrong_value") > 0.95, by_kind
    assert by_kind["wrong_value"] > 0.8, by_kind
    assert (out / "model.safetensors").exists() and json.loads((out / "config.json").read_text())["id2label"] == {
        "0": "LABEL_0"
    }


@pytest.fixture(scope="module")
def doubled_rm(doubling_rm, tmp_path_factory):
    """The reward model with its score head times 2, in the same dtype: each score exactly twice the model's (a
    power of two scales every product and sum of the head without rounding)."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("rm-doubled") / "rm"
    shutil.copytree(doubling_rm[0], out)
    weights = load_file(out / "model.safetensors")
    weights["score.weight"] = weights["score.weight"] * 2
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _first_scores(backend, policy, reward, out) -> list[float]:
    """A 2-update run of ``backend`` with ``reward``: each update's mean score, checked finite."""
    run = _cli(
        "ppo", "--backend", backend, "--policy", str(policy), "--reward", str(reward), "--out", str(out),
        "--batch-size", "8", "--total-episodes", "16", "--probe-every", "0", "--eval-n", "20",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(math.isfinite(r["objective/scores"]) for r in lines)
    return [r["objective/scores"] for r in lines]


@pytest.mark.parametrize(
    "backend",
    ["scratch", pytest.param("grpo", marks=pytest.mark.trl_api), pytest.param("trl", marks=pytest.mark.needs_trl_ppo)],
)
def test_the_reward_model_drives_ppo_and_grpo(doubling_rm, doubled_rm, trained_artifacts, tmp_path, backend):
    """The scores each backend trains on are the reward model's: with its head doubled, the same seed's first
    rollouts (before any update differs) score exactly twice as high."""
    policy = trained_artifacts["policy"]
    scores = _first_scores(backend, policy, doubling_rm[0], tmp_path / "rm")
    doubled = _first_scores(backend, policy, doubled_rm, tmp_path / "doubled")
    assert abs(scores[0]) > 0.1 and doubled[0] == pytest.approx(2 * scores[0], rel=1e-5), (scores, doubled)


def test_centring_makes_right_answers_score_alike(doubling_rm, trained_artifacts, tmp_path):
    """TRL's center_rewards_coefficient (our default 0.01) pulls every score towards zero; the spread of the
    right answers' scores across prompts is what PPO's critic would otherwise have to learn. Measured
    (600 steps): std 0.54 centred against 3.35 plain, pairwise accuracy 0.93 against 0.97."""
    from trl_ext.tasks.doubling.stages import RewardModelConfig, run_train_reward_model

    centred = run_train_reward_model(
        RewardModelConfig(out=str(tmp_path / "rm"), base=str(trained_artifacts["policy"]), steps=600, eval_n=400)
    )
    plain = doubling_rm[1]
    assert centred["config"]["center_rewards_coefficient"] == 0.01
    assert centred["heldout_scores"]["chosen"]["std"] < 0.5 * plain["heldout_scores"]["chosen"]["std"], (centred, plain)
    assert abs(centred["heldout_scores"]["chosen"]["mean"]) < abs(plain["heldout_scores"]["chosen"]["mean"])
    assert centred["heldout_pairwise_accuracy"] > 0.85, centred


def test_reward_model_options_are_checked(tmp_path):
    from trl_ext.tasks.doubling.stages import RewardModelConfig

    with pytest.raises(ValueError, match="center_rewards_coefficient must be >= 0"):
        RewardModelConfig(out=str(tmp_path), center_rewards_coefficient=-0.1)


def test_bad_preference_data_is_named(tmp_path):
    from datasets import Dataset

    from trl_ext.stages.preferences import PreferenceError, check_preferences

    with pytest.raises(PreferenceError, match="row 1: 'rejected' is missing or empty"):
        check_preferences(Dataset.from_dict({"chosen": ["a", "b"], "rejected": ["c", ""]}))
    with pytest.raises(PreferenceError, match="row 0: 'chosen' and 'rejected' are identical"):
        check_preferences(Dataset.from_dict({"prompt": ["p"], "chosen": ["a"], "rejected": ["a"]}))
    with pytest.raises(PreferenceError, match="lacks \\['rejected'\\]"):
        check_preferences(Dataset.from_dict({"chosen": ["a"]}))
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        json.dumps({"chosen": "a", "rejected": "b"})
        + "\n"
        + json.dumps(
            {"chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}
        )
        + "\n"
    )
    from trl_ext.stages.preferences import load_preferences

    with pytest.raises(ValueError, match="mixed.jsonl:2: mixes text and conversations"):
        load_preferences(mixed)
    policy_dir = tmp_path / "p"
    from tiny_models import tiny_qwen2

    tiny_qwen2(policy_dir)
    (tmp_path / "d.jsonl").write_text(
        "".join(json.dumps({"chosen": f"a{i}", "rejected": f"b{i}"}) + "\n" for i in range(8))
    )
    run = _cli(
        "train-reward-model", "--out", str(tmp_path / "o"), "--data", str(tmp_path / "d.jsonl"), "--eval-n", "20"
    )
    assert run.returncode == 2 and "has 8 rows: not enough for 20 held-out pairs" in run.stderr
    run = _cli("train-reward-model", "--out", str(tmp_path / "o"), "--base", str(tmp_path / "nowhere"))
    assert run.returncode == 2 and "does not exist" in run.stderr


def test_preference_answers_of_another_type_and_text_the_base_cannot_encode_are_named():
    """Checked before training: a number for an answer, a margin that is not a number, and text outside the base
    tokenizer's vocabulary (the doubling BERT's, the default base), each naming its row."""
    from datasets import Dataset

    from trl_ext.stages.preferences import PreferenceError, check_preferences
    from trl_ext.stages.reward_model import tokenize_preferences
    from trl_ext.tasks.doubling.tokenizer import build_tokenizer

    rows = {"prompt": ["S数字:1x2=", "S数字:2x2="], "chosen": ["2E", "4E"], "rejected": ["3E", "5E"]}
    with pytest.raises(PreferenceError, match=r"row 0: 'chosen' is 2 \(int\); an answer is text or a list of messages"):
        check_preferences(Dataset.from_dict({**rows, "chosen": [2, 4]}))
    with pytest.raises(PreferenceError, match="row 0: 'margin' is 'high'; a margin is a number"):
        check_preferences(Dataset.from_dict({**rows, "margin": ["high", "low"]}))
    english = {**rows, "chosen": ["2E", "Paris."]}
    with pytest.raises(
        InputError, match=r"row 1: the tokenizer .* cannot encode its 'chosen' answer .*give the reward"
    ):
        tokenize_preferences(Dataset.from_dict(english), build_tokenizer())
