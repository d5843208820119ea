"""The real-LLM recipe end to end with tiny, randomly initialised Qwen2 and DeBERTa-v2 models."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import DEBERTA_V2_VOCAB, QWEN2_VOCAB, tiny_deberta_reward, tiny_qwen2

ROOT = Path(__file__).resolve().parents[1]


# These tiny policies have no chat template: the recipe's prompts as plain lines (prompts.jsonl is conversational).
@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return tiny_qwen2(root / "qwen2"), tiny_deberta_reward(root / "deberta")


@pytest.mark.parametrize("backend", [pytest.param("trl", marks=pytest.mark.needs_trl_ppo), "scratch"])
def test_rlhf_recipe_with_lora(tiny_models, tmp_path, backend):
    policy, reward = tiny_models
    out = tmp_path / backend
    cmd = [
        sys.executable,
        str(ROOT / "recipes/rlhf/ppo_rlhf.py"),
        "--backend",
        backend,
        "--policy",
        str(policy),
        "--reward",
        str(reward),
        "--prompts",
        str(ROOT / "recipes/rlhf/prompts_plain.txt"),
        "--out",
        str(out),
        "--batch-size",
        "4",
        "--total-episodes",
        "8",
        "--response-length",
        "8",
        "--learning-rate",
        "1e-2",
        "--lora-r",
        "4",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 2 and summary["first_score"] is not None
    adapter = load_file(str(out / "adapter_model.safetensors"))
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b)  # LoRA B starts at zero: it was trained
    assert not any("lora" not in name for name in adapter)  # only the adapter is saved, not the base


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_rlhf_recipe_with_half_precision_checkpoints_of_real_vocabulary_sizes(tmp_path, dtype):
    """Checkpoints as the hub has them: saved in bf16 (or fp16), Qwen2's and DeBERTa-v2's vocabularies."""
    policy = tiny_qwen2(tmp_path / "qwen2", vocab_size=QWEN2_VOCAB, dtype=dtype)
    reward = tiny_deberta_reward(tmp_path / "deberta", vocab_size=DEBERTA_V2_VOCAB, dtype=dtype)
    from trl_ext.commands.cli import main

    out = tmp_path / "o"
    code = main(
        [
            "rlhf",
            "--policy",
            str(policy),
            "--reward",
            str(reward),
            "--prompts",
            str(ROOT / "recipes/rlhf/prompts_plain.txt"),
            "--out",
            str(out),
            "--batch-size",
            "4",
            "--total-episodes",
            "4",
            "--response-length",
            "6",
            "--learning-rate",
            "1e-2",
            "--lora-r",
            "4",
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 1 and summary["first_score"] is not None
    adapter = load_file(str(out / "adapter_model.safetensors"))
    assert any(t.abs().sum() > 0 for name, t in adapter.items() if "lora_B" in name)  # the adapters trained


def test_rlhf_rejects_bad_prompts_file(tiny_models, tmp_path):
    policy, reward = tiny_models
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    from trl_ext.commands.cli import main

    code = main(
        ["rlhf", "--policy", str(policy), "--reward", str(reward), "--prompts", str(bad), "--out", str(tmp_path / "o")]
    )
    assert code == 2 and not (tmp_path / "o").exists()


def test_rlhf_with_a_reward_function_instead_of_a_reward_model(tiny_models, tmp_path):
    policy, _ = tiny_models
    (tmp_path / "rf.py").write_text(
        "def vowels(completions, **kwargs):\n    return [sum(ch in 'aeiou' for ch in c) / 8 for c in completions]\n"
    )
    from trl_ext.commands.cli import main

    out = tmp_path / "o"
    code = main(
        [
            "rlhf",
            "--policy",
            str(policy),
            "--reward-fn",
            f"{tmp_path / 'rf.py'}:vowels",
            "--prompts",
            str(ROOT / "recipes/rlhf/prompts_plain.txt"),
            "--out",
            str(out),
            "--batch-size",
            "4",
            "--total-episodes",
            "4",
            "--response-length",
            "8",
            "--lora-r",
            "4",
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0 and summary["updates"] == 1 and summary["first_score"] >= 0
    assert summary["config"]["models"]["reward_fn"].endswith("rf.py:vowels")


@pytest.mark.trl_api  # TRL's SFTTrainer and RewardTrainer
def test_rlhf_pipeline_sft_then_reward_model_then_ppo(tiny_models, tmp_path):
    """Seeds 002-004 in one command: SFT on prompt/completion rows, a reward model from preference
    pairs (DeBERTa-v2 base), then PPO with LoRA on the SFT model; a second run reuses both stages."""
    policy, reward_base = tiny_models
    out = tmp_path / "pipeline"
    cmd = [
        sys.executable,
        str(ROOT / "recipes/rlhf/ppo_rlhf.py"),
        "--policy",
        str(policy),
        "--sft-data",
        str(ROOT / "recipes/rlhf/sft.jsonl"),
        "--sft-steps",
        "4",
        "--preferences",
        str(ROOT / "recipes/rlhf/preferences.jsonl"),
        "--reward-base",
        str(reward_base),
        "--reward-steps",
        "4",
        "--reward-eval-n",
        "4",
        "--stage-batch-size",
        "4",
        "--prompts",
        str(ROOT / "recipes/rlhf/prompts_plain.txt"),
        "--out",
        str(out),
        "--batch-size",
        "4",
        "--total-episodes",
        "8",
        "--response-length",
        "8",
        "--lora-r",
        "4",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    sft = AutoModelForCausalLM.from_pretrained(out / "sft")
    base = AutoModelForCausalLM.from_pretrained(policy)
    assert not any("lora" in name for name, _ in sft.named_parameters())  # the SFT adapter was merged
    assert any((a - b).abs().max() > 0 for a, b in zip(sft.parameters(), base.parameters()))
    stage = json.loads((out / "reward_model" / "stage.json").read_text())
    recounted = _heldout_accuracy_recounted(out / "reward_model", ROOT / "recipes/rlhf/preferences.jsonl", 4)
    assert stage["heldout_pairs"] == 4 and stage["heldout_pairwise_accuracy"] == recounted
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 2 and summary["first_score"] is not None
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(out / "sft")  # PPO ran on the SFT model

    markers = {name: (out / name / "stage.json").stat().st_mtime_ns for name in ("sft", "reward_model")}
    # --overwrite: PPO writes its new adapter over the last one; the finished stages are kept and reused
    again = subprocess.run([*cmd, "--overwrite"], capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[sft] reusing" in again.stdout and "[reward_model] reusing" in again.stdout
    assert markers == {name: (out / name / "stage.json").stat().st_mtime_ns for name in markers}


def test_rlhf_pipeline_bad_inputs_are_named(tiny_models, tmp_path, capsys):
    policy, reward_base = tiny_models
    from trl_ext.commands.cli import main

    prompts = str(ROOT / "recipes/rlhf/prompts_plain.txt")
    sft = tmp_path / "sft.jsonl"
    sft.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": ""}\n')
    cases = [
        (["--reward", str(reward_base), "--sft-data", str(sft)], "row 1: 'completion' is missing or empty"),
        ([], "give --reward (a reward model directory), --reward-fn (module:callable), --reward-url, --preferences"),
        (
            ["--reward", str(reward_base), "--preferences", str(ROOT / "recipes/rlhf/preferences.jsonl")],
            "give --reward or --preferences, not both",
        ),
        (
            ["--preferences", str(ROOT / "recipes/rlhf/preferences.jsonl"), "--reward-base", str(policy / "nothing")],
            "does not exist",
        ),
    ]
    for number, (extra, message) in enumerate(cases):
        out = tmp_path / f"o{number}"
        assert main(["rlhf", "--policy", str(policy), "--prompts", prompts, "--out", str(out), *extra]) == 2
        assert message in capsys.readouterr().err, extra


@pytest.mark.parametrize("backend", ["scratch", pytest.param("trl", marks=pytest.mark.needs_trl_ppo)])
def test_rlhf_defaults_and_the_scratch_trainers_kl_guard(tiny_models, tmp_path, backend):
    # The recipe's LoRA defaults on both backends; the adaptive KL weight only on the scratch trainer (TRL's PPO
    # keeps a fixed one), recorded with its source; a flag still wins over the preset.
    from trl_ext.commands.cli import main
    from trl_ext.runs.rlhf_options import RLHF_DEFAULTS, RLHF_SCRATCH_PRESET

    policy, reward = tiny_models
    out = tmp_path / backend
    code = main(
        [
            "rlhf",
            "--backend",
            backend,
            "--policy",
            str(policy),
            "--reward",
            str(reward),
            "--prompts",
            str(ROOT / "recipes/rlhf/prompts_plain.txt"),
            "--out",
            str(out),
            "--batch-size",
            "4",
            "--total-episodes",
            "8",
            "--response-length",
            "8",
            "--lora-r",
            "4",
            *(["--kl-horizon", "8"] if backend == "scratch" else []),  # TRL's PPO has no KL controller to pace
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0 and summary["updates"] == 2
    train, sources = summary["config"]["train"], summary["sources"]
    for name, value in RLHF_DEFAULTS.items():
        if name != "response_length":  # set by a flag here
            assert train[name] == value and sources[name] == "command default"
    if backend == "scratch":
        assert sources["kl_horizon"] == "flag" and train["kl_horizon"] == 8
        assert train["kl_target"] == RLHF_SCRATCH_PRESET["kl_target"] and sources["kl_target"] == "preset rlhf-scratch"
        from trl_ext.ppo.core import adaptive_kl_coef

        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert rows[0]["objective/kl_coef"] == train["kl_coef"]
        assert rows[1]["objective/kl_coef"] == pytest.approx(
            adaptive_kl_coef(  # the controller's step, 4 episodes
                train["kl_coef"], rows[0]["objective/kl"], train["kl_target"], train["kl_horizon"], 4
            )
        )
    else:
        assert train["kl_target"] is None and sources["kl_target"] == "default"


def test_positivity_reward_counts_tone_words_per_square_root_of_length(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "recipes" / "rlhf"))
    from positivity import positivity

    warm = "Rainbows are a wonderful sight that brings joy."  # 2 positive of 8 words
    grim = "Earthquakes are dangerous and cause terrible damage."  # 3 negative of 7
    salad = " ".join(["wonderful"] * 16)
    scores = positivity([warm, grim, "", "Rain is water.", salad, [{"role": "assistant", "content": warm}]])
    assert scores[0] == pytest.approx(2 / 8**0.5) and scores[1] == pytest.approx(-3 / 7**0.5)
    assert scores[2] == scores[3] == 0.0 and scores[4] == pytest.approx(4.0) and scores[5] == scores[0]


def test_concise_reward_is_topic_coverage_less_words_over_48(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "recipes" / "rlhf"))
    from concise import concise

    question = [{"role": "user", "content": "Explain ocean tides in a few sentences."}]  # topic: ocean, tides
    short = "The Moon's pull raises the ocean twice a day: tides."  # 10 words, both topic words
    off_topic = "Volcanoes erupt when magma rises."  # 5 words, no topic word
    rambling = " ".join(["Tides"] + ["and"] * 39)  # 40 words, one topic word
    scores = concise([question] * 5, [short, off_topic, rambling, "", [{"role": "assistant", "content": "Tide."}]])
    assert scores[0] == pytest.approx(1 - 10 / 48) and scores[1] == pytest.approx(-5 / 48)
    assert scores[2] == pytest.approx(0.5 - 40 / 48) and scores[3] == 0.0
    assert scores[4] == pytest.approx(0.5 - 1 / 48)  # "Tide" matches "tides"
    assert concise(["Tell me about gravity."], ["Gravity pulls."]) == [pytest.approx(1 - 2 / 48)]  # plain-text prompt


def _heldout_accuracy_recounted(folder, preferences, eval_n: int) -> float:
    """The saved reward model's share of the held-out pairs (the file's last ``eval_n``) scored chosen above
    rejected, as PPO scores them."""
    from trl_ext.models.loading import load_sequence_classifier
    from trl_ext.stages.preferences import preference_split
    from trl_ext.stages.reward_model import score_pairs

    _, heldout = preference_split(preferences, eval_n)
    chosen, rejected = score_pairs(*load_sequence_classifier(folder, "reward model"), heldout)
    return sum(c > r for c, r in zip(chosen, rejected, strict=True)) / eval_n
