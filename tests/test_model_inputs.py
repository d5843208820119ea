"""Bad input on the real-model path: each case one ``trl-ext: error:`` line and exit 2, nothing
written, and the same folder checks for ``ppo``, ``rlhf``, ``train-reward-model`` and the library's trainer.

The models are saved as hub checkpoints are: bf16, real vocabulary sizes (SmolLM2's Llama, DeBERTa-v3's),
tiny widths."""

import importlib.util
import json
import shutil

import pytest
import torch
from tiny_models import DEBERTA_V2_VOCAB, char_tokenizer, tiny_deberta_reward

from trl_ext.commands.cli import main
from trl_ext.models.directory import ArtifactError
from trl_ext.models.loading import check_model_dir

SMOLLM2_VOCAB = 49152
LLAMA_LINEAR = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"


def tiny_llama(path):
    """SmolLM2's architecture (Llama, tied embeddings) and vocabulary size; its tokenizer has an eos and no
    pad token, as base Llama checkpoints do, so the loader's pad = eos rule is exercised."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = char_tokenizer(["<|im_end|>", "<unk>"], eos_token="<|im_end|>", unk_token="<unk>")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=SMOLLM2_VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    llama = tiny_llama(root / "smollm2")
    reward = tiny_deberta_reward(root / "deberta_rm", vocab_size=DEBERTA_V2_VOCAB, dtype=torch.bfloat16)
    gguf = root / "gguf_only"  # what llama.cpp users have: the .gguf file and nothing else
    gguf.mkdir()
    (gguf / "SmolLM2-135M-Instruct-Q8_0.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    broken = root / "slow_tokenizer_only"  # a tokenizer.model transformers cannot read without sentencepiece
    shutil.copytree(llama, broken)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (broken / name).unlink(missing_ok=True)
    (broken / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    (broken / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    no_config = root / "no_config"
    no_config.mkdir()
    (no_config / "README.md").write_text("weights elsewhere\n")
    no_weights = root / "no_weights"
    no_weights.mkdir()
    shutil.copy(llama / "config.json", no_weights / "config.json")
    a_file = root / "a_file.txt"
    a_file.write_text("not a folder\n")
    prompts = root / "prompts.txt"
    prompts.write_text("".join(f"Question {i}: what is {i} + {i}? Answer with just the number.\n" for i in range(4)))
    prefs = root / "prefs.jsonl"
    prefs.write_text(
        "".join(
            json.dumps({"prompt": f"{i}+{i}=", "chosen": str(2 * i), "rejected": str(2 * i + 1)}) + "\n"
            for i in range(6)
        )
    )
    reward_fn = root / "rf.py"
    reward_fn.write_text("def length(completions, **kwargs):\n    return [len(c) / 8 for c in completions]\n")
    return {
        "llama": llama,
        "reward": reward,
        "gguf": gguf,
        "broken_tokenizer": broken,
        "no_config": no_config,
        "no_weights": no_weights,
        "file": a_file,
        "missing": root / "nowhere",
        "prompts": prompts,
        "prefs": prefs,
        "reward_fn": f"{reward_fn}:length",
        "root": root,
    }


def run_cli(capfd, args):
    """The CLI in-process: exit code, stdout, stderr, library logs included (transformers' handler holds the
    stream it was made with, pytest's, so it is pointed at this test's for the call)."""
    import logging
    import sys

    from transformers.utils import logging as hf_logging

    handlers = [h for h in hf_logging.get_logger().handlers if isinstance(h, logging.StreamHandler)]
    streams = [h.setStream(sys.stderr) for h in handlers]
    capfd.readouterr()
    try:
        code = main([str(a) for a in args])
    finally:
        for handler, stream in zip(handlers, streams):
            handler.setStream(stream)
    out, err = capfd.readouterr()
    return code, out, err


def rlhf_args(folders, out, *extra, policy=None, reward=None):
    reward_args = ["--reward", reward or folders["reward"]]
    return [
        "rlhf",
        "--policy",
        policy or folders["llama"],
        *reward_args,
        "--prompts",
        folders["prompts"],
        "--out",
        out,
        "--batch-size",
        "4",
        "--total-episodes",
        "4",
        "--response-length",
        "4",
        "--lora-r",
        "4",
        *extra,
    ]


def assert_refused(code, err, out_dir, *fragments):
    assert code == 2, err
    assert err.startswith("trl-ext: error: ") and err.count("\n") == 1, err  # one line, nothing else
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert not out_dir.exists()  # a refused run leaves no output folder


# ---- the bad-input table, through `trl-ext rlhf` -----------------------------------------------------------------


def test_gguf_folder_as_policy_says_how_to_convert(folders, tmp_path, capfd):
    code, _, err = run_cli(capfd, rlhf_args(folders, tmp_path / "o", policy=folders["gguf"]))
    gguf_file = folders["gguf"] / "SmolLM2-135M-Instruct-Q8_0.gguf"
    assert_refused(
        code,
        err,
        tmp_path / "o",
        f"policy directory {str(folders['gguf'])!r} holds a GGUF file",
        f"`python -m trl_ext.models.gguf {gguf_file} --out DIR`",
        "bf16 safetensors",
    )
    # the .gguf file itself given as the folder: the same advice
    code, _, err = run_cli(capfd, rlhf_args(folders, tmp_path / "o", policy=gguf_file))
    assert_refused(code, err, tmp_path / "o", "is a GGUF file, not a model directory", "python -m trl_ext.models.gguf")


def test_lora_targets_that_match_nothing_list_the_linear_modules(folders, tmp_path, capfd):
    code, _, err = run_cli(capfd, rlhf_args(folders, tmp_path / "o", "--lora-target-modules", "nosuchmod"))
    assert_refused(
        code,
        err,
        tmp_path / "o",
        "LoRA target modules nosuchmod match no module of the policy "
        f"(LlamaForCausalLM in {str(folders['llama'])!r}); its linear modules: {LLAMA_LINEAR} (or 'all-linear')",
    )
    # one good name and one typo: peft would silently drop the typo; refused here, naming only it
    code, _, err = run_cli(capfd, rlhf_args(folders, tmp_path / "o", "--lora-target-modules", "q_proj,v_prj"))
    assert_refused(code, err, tmp_path / "o", "LoRA target modules v_prj match no module")


def test_causal_lm_as_reward_model_is_named_before_it_loads(folders, tmp_path, capfd):
    code, _, err = run_cli(capfd, rlhf_args(folders, tmp_path / "o", reward=folders["llama"]))
    assert_refused(
        code,
        err,
        tmp_path / "o",
        f"reward model directory {str(folders['llama'])!r} holds a causal LM "
        "(LlamaForCausalLM), not a sequence classifier",
    )
    assert "newly initialized" not in err and "MISSING" not in err  # no classifier was built from it


def test_tokenizer_that_cannot_load_is_one_line(folders, tmp_path, capfd):
    code, _, err = run_cli(capfd, rlhf_args(folders, tmp_path / "o", policy=folders["broken_tokenizer"]))
    assert_refused(
        code,
        err,
        tmp_path / "o",
        f"policy directory {str(folders['broken_tokenizer'])!r}: its tokenizer cannot be loaded: ",
    )
    if importlib.util.find_spec("sentencepiece") is None:  # the advice that fits: not tiktoken, which transformers
        assert "pip install sentencepiece" in err  # would fall back to and ask for


def test_two_label_classifier_as_reward_is_refused_from_its_config(folders, tmp_path, capfd):
    from transformers import AutoModelForSequenceClassification

    two = tmp_path / "two_labels"
    AutoModelForSequenceClassification.from_pretrained(
        folders["reward"], num_labels=2, ignore_mismatched_sizes=True
    ).save_pretrained(two)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folders["reward"] / name, two / name)
    code, _, err = run_cli(capfd, rlhf_args(folders, tmp_path / "o", reward=two))
    assert_refused(code, err, tmp_path / "o", "has 2 labels; the RLHF recipe expects a scalar reward model")


def test_truncated_prompts_are_said_once_and_the_run_goes_on(folders, tmp_path, capfd):
    out = tmp_path / "o"
    code, stdout, _ = run_cli(capfd, rlhf_args(folders, out, "--max-prompt-length", "2"))
    assert code == 0
    notices = [line for line in stdout.splitlines() if "longer than max_prompt_length" in line]
    longest = max(len(line) for line in folders["prompts"].read_text().splitlines())  # a character a token
    assert notices == [
        f"[prompts] 4 of 4 prompts are longer than max_prompt_length 2 and were cut on the left, "
        f"by up to {longest - 2} tokens (the longest had {longest})"
    ]
    assert json.loads((out / "summary.json").read_text())["updates"] == 1


def test_truncation_notice():
    from trl_ext.data.prompt_dataset import truncate_prompts
    from trl_ext.models.loading import truncation_notice

    _, cut = truncate_prompts([[1] * 5, [1] * 2, [1] * 9], 3)
    assert truncation_notice(cut, 3) == (
        "[prompts] 2 of 3 prompts are longer than max_prompt_length 3 and were cut "
        "on the left, by up to 6 tokens (the longest had 9)"
    )
    assert truncation_notice(truncate_prompts([[1] * 3], 3)[1], 3) is None


# ---- the same folder checks for every entry point -------------------------------------------------------------


def _ppo(folders, path, out):
    return ["ppo", "--policy", path, "--reward-fn", folders["reward_fn"], "--out", out]


def _rlhf(folders, path, out):
    return [
        "rlhf",
        "--policy",
        path,
        "--reward-fn",
        folders["reward_fn"],
        "--prompts",
        folders["prompts"],
        "--out",
        out,
    ]


def _train_reward_model(folders, path, out):
    return [
        "train-reward-model",
        "--base",
        path,
        "--data",
        folders["prefs"],
        "--eval-n",
        "2",
        "--steps",
        "1",
        "--out",
        out,
    ]


ENTRY_POINTS = {
    "ppo": (_ppo, "policy"),
    "rlhf": (_rlhf, "policy"),
    "train-reward-model": (_train_reward_model, "reward model base"),
    "PPOTrainer": (None, "policy"),
}
BAD_FOLDERS = {
    "missing": "does not exist",
    "file": "is a file, not a model directory",
    "no_config": "holds no config.json",
    "gguf": "python -m trl_ext.models.gguf",
    "no_weights": "holds no *.safetensors weights",
    "broken_tokenizer": "its tokenizer cannot be loaded",
}


def _refusal(entry, folders, path, out, capfd) -> str:
    """The one line the entry point refuses ``path`` with (the library's trainer: its exception's text)."""
    build, _ = ENTRY_POINTS[entry]
    if build is None:
        from trl_ext.ppo.config import PPOConfig
        from trl_ext.ppo.trainer import PPOTrainer

        with pytest.raises(ArtifactError) as caught:
            PPOTrainer(
                str(path), lambda completions, **kw: [0.0] * len(completions), args=PPOConfig(output_dir=str(out))
            )
        assert not out.exists()
        return str(caught.value)
    code, _, err = run_cli(capfd, build(folders, path, out))
    assert_refused(code, err, out)
    return err.removeprefix("trl-ext: error: ").rstrip("\n")


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("bad", list(BAD_FOLDERS))
def test_every_entry_point_checks_folders_alike(folders, tmp_path, capfd, entry, bad):
    role = ENTRY_POINTS[entry][1]
    with pytest.raises(ArtifactError) as expected:
        check_model_dir(folders[bad], role)
    assert BAD_FOLDERS[bad] in str(expected.value) and f"{role} " in str(expected.value)
    assert _refusal(entry, folders, folders[bad], tmp_path / "o", capfd) == str(expected.value)


@pytest.mark.parametrize("entry", ["ppo", "rlhf", "PPOTrainer"])
def test_every_entry_point_refuses_a_classifier_as_policy(folders, tmp_path, capfd, entry):
    line = _refusal(entry, folders, folders["reward"], tmp_path / "o", capfd)
    assert line == (
        f"policy directory {str(folders['reward'])!r} holds a sequence classifier "
        "(DebertaV2ForSequenceClassification), not a causal LM"
    )


def test_every_entry_point_refuses_a_causal_lm_as_reward_model(folders, tmp_path, capfd):
    from trl_ext.ppo.trainer import PPOTrainer

    expected = (
        f"reward model directory {str(folders['llama'])!r} holds a causal LM (LlamaForCausalLM), not a "
        "sequence classifier"
    )
    for args in (
        ["ppo", "--policy", folders["llama"], "--reward", folders["llama"], "--out", tmp_path / "a"],
        rlhf_args(folders, tmp_path / "b", reward=folders["llama"]),
    ):
        code, _, err = run_cli(capfd, args)
        assert_refused(code, err, args[args.index("--out") + 1], expected)
    with pytest.raises(ArtifactError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        PPOTrainer(str(folders["llama"]), str(folders["llama"]))


# ---- the loader itself ----------------------------------------------------------------------------------------


def test_loader_applies_the_pad_eos_rule_and_reads_bf16(folders):
    from trl_ext.models.loading import load_policy, load_sequence_classifier

    policy, tok = load_policy(folders["llama"])
    assert tok.pad_token == tok.eos_token == "<|im_end|>" and tok.padding_side == "left"  # pad = eos when missing
    assert next(policy.parameters()).dtype == torch.bfloat16  # 'auto': the checkpoint's dtype
    reward, reward_tok = load_sequence_classifier(folders["reward"], "reward model", labels=1)
    assert reward_tok.pad_token == "[PAD]" and reward_tok.padding_side == "right"
    assert reward.config.num_labels == 1 and reward.config.pad_token_id == reward_tok.pad_token_id


def test_a_policy_tokenizer_without_eos_is_refused(folders, tmp_path):
    no_eos = tmp_path / "no_eos"
    shutil.copytree(folders["llama"], no_eos)
    char_tokenizer(["<unk>"], unk_token="<unk>").save_pretrained(no_eos)
    with pytest.raises(
        ArtifactError,
        match=r"the policy tokenizer of '.*no_eos' has no eos token: a response could "
        "never end",
    ):
        check_model_dir(no_eos, "policy")


def test_library_peft_mismatch_is_an_input_error_and_a_bug_keeps_its_type(folders, monkeypatch):
    import peft
    from peft import LoraConfig

    from trl_ext.errors import InputError
    from trl_ext.ppo.config import PPOConfig
    from trl_ext.ppo.trainer import PPOTrainer

    def reward(completions, **kw):
        return [0.0] * len(completions)

    lora = LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["nosuchmod"])
    with pytest.raises(
        InputError,
        match=f"LoRA target modules nosuchmod match no module of the policy "
        rf"\(LlamaForCausalLM\); its linear modules: {LLAMA_LINEAR}",
    ):
        PPOTrainer(str(folders["llama"]), reward, args=PPOConfig(), peft_config=lora)

    def broken(model, config, *args, **kwargs):
        raise ValueError("a bug inside peft, not a target mismatch")

    monkeypatch.setattr(peft, "get_peft_model", broken)
    with pytest.raises(ValueError, match="a bug inside peft") as caught:
        PPOTrainer(str(folders["llama"]), reward, args=PPOConfig(), peft_config=LoraConfig(r=4))
    assert not isinstance(caught.value, InputError)


def test_library_peft_policy_prints_no_warning(folders):
    """peft reads transformers' deprecated ``is_gradient_checkpointing``; the library's trainer must not pass
    that FutureWarning on to its user (the CLI's filters do not apply to library use)."""
    import warnings

    from peft import LoraConfig

    from trl_ext.ppo.config import PPOConfig
    from trl_ext.ppo.trainer import PPOTrainer

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # also what was shown once before, elsewhere in the session
        trainer = PPOTrainer(
            str(folders["llama"]),
            lambda completions, **kw: [0.0] * len(completions),
            args=PPOConfig(),
            peft_config=LoraConfig(task_type="CAUSAL_LM", r=4),
        )
    assert [f"{w.category.__name__}: {w.message}" for w in seen] == []
    # silenced around peft's call only: the attribute read anywhere else still warns
    with pytest.warns(FutureWarning, match="is_gradient_checkpointing"):
        trainer.policy.get_base_model().is_gradient_checkpointing  # noqa: B018 (the read is what warns)


@pytest.mark.trl_api  # TRL's SFTTrainer builds the adapter
def test_sft_lora_mismatch_is_one_line(folders, tmp_path):
    from datasets import Dataset
    from peft import LoraConfig

    from trl_ext.models.loading import load_policy
    from trl_ext.stages.sft import supervised_finetune

    model, tok = load_policy(folders["llama"], role="SFT base")
    rows = Dataset.from_dict({"prompt": ["1+1="] * 4, "completion": ["2"] * 4})
    with pytest.raises(ArtifactError, match=f"match no module of the SFT base .*its linear modules: {LLAMA_LINEAR}"):
        supervised_finetune(
            model,
            tok,
            rows,
            output_dir=str(tmp_path / "sft"),
            steps=1,
            batch_size=2,
            learning_rate=1e-3,
            peft_config=LoraConfig(task_type="CAUSAL_LM", target_modules=["qproj"]),
        )
