"""Issue 34: `rlhf --prompts` in TRL's two formats, the chat template (`--chat-template auto|always|never`),
reward functions handed GRPO's format, and conversational SFT/preference rows. Tiny Qwen2 checkpoints as the
hub has them (bf16, Qwen2's vocabulary size): one with Qwen2.5-Instruct's own chat template and special
tokens, one with no template."""

import json
import re
from pathlib import Path

import pytest
import torch
from tiny_models import DEBERTA_V2_VOCAB, QWEN2_VOCAB, tiny_deberta_reward, tiny_qwen2

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "rlhf"
RECORDER = f"{Path(__file__).with_name('chat_prompt_rewards.py')}:record"
TINY_RUN = ["--total-episodes", "4", "--batch-size", "2", "--response-length", "4", "--lora-r", "4"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat_prompts")
    return {
        "chat": tiny_qwen2(root / "qwen_chat", chat_template="qwen2.5", vocab_size=QWEN2_VOCAB, dtype=torch.bfloat16),
        "plain": tiny_qwen2(root / "qwen_plain", vocab_size=QWEN2_VOCAB, dtype=torch.bfloat16),
        "deberta": tiny_deberta_reward(root / "deberta", vocab_size=DEBERTA_V2_VOCAB, dtype=torch.bfloat16),
    }


@pytest.fixture(scope="module")
def tokenizers(models):
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(models[name]) for name in ("chat", "plain")}


def conversations() -> list:
    return [json.loads(line)["prompt"] for line in (RECIPE / "prompts.jsonl").read_text().splitlines()]


def texts() -> list[str]:
    return (RECIPE / "prompts_plain.txt").read_text().splitlines()


def chat_ids(tokenizer, conversation) -> list[int]:
    return list(
        tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
    )


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------ what the policy receives


def test_conversations_reach_the_policy_as_the_chat_template_renders_them(tokenizers):
    from trl_ext.data.prompt_files import prepare_prompts

    tok = tokenizers["chat"]
    prepared = prepare_prompts(RECIPE / "prompts.jsonl", tok, max_length=4096)
    assert prepared.templated and prepared.source.kind == "conversational"
    assert prepared.dataset["input_ids"] == [chat_ids(tok, c) for c in conversations()]
    assert prepared.dataset["prompt"] == conversations()  # reward functions get the conversation, not its text
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    first = prepared.dataset["input_ids"][0]
    assert first[0] == im_start and first.count(im_end) == 2  # Qwen's special tokens, each one token
    generation_prompt = tok(text="<|im_start|>assistant\n")["input_ids"]
    assert all(ids[-len(generation_prompt) :] == generation_prompt for ids in prepared.dataset["input_ids"])
    assert prepared.summary == (
        f"[prompts] 8 conversations from {RECIPE / 'prompts.jsonl'}, rendered with the "
        "policy's chat template (generation prompt added)"
    )


@pytest.mark.parametrize("name", ["chat", "plain"])
def test_standard_rows_are_the_raw_text_under_never_and_on_a_tokenizer_without_template(tokenizers, name, tmp_path):
    from trl_ext.data.prompt_files import prepare_prompts

    tok = tokenizers[name]
    standard = write_jsonl(tmp_path / "p.jsonl", [{"prompt": t, "answer": str(i)} for i, t in enumerate(texts())])
    mode = "never" if name == "chat" else "auto"
    for path in (standard, RECIPE / "prompts_plain.txt"):
        prepared = prepare_prompts(path, tok, chat_template=mode)
        assert not prepared.templated
        assert prepared.dataset["input_ids"] == [tok(text=t)["input_ids"] for t in texts()]
        assert prepared.dataset["prompt"] == texts()
    assert prepared.source.kind == "plain" and "plain-text lines" in prepared.summary
    assert prepare_prompts(standard, tok, chat_template=mode).dataset["answer"] == [str(i) for i in range(8)]


@pytest.mark.parametrize(
    "name, mode, templated",
    [
        ("chat", "auto", True),
        ("chat", "always", True),
        ("chat", "never", False),
        ("plain", "auto", False),
        ("plain", "never", False),
    ],
)
def test_chat_template_modes_on_plain_prompts(tokenizers, name, mode, templated):
    from trl_ext.data.prompt_files import prepare_prompts

    tok = tokenizers[name]
    prepared = prepare_prompts(RECIPE / "prompts_plain.txt", tok, chat_template=mode)
    assert prepared.templated == templated
    if templated:  # each line is one user turn, for the policy and for the reward functions alike
        turns = [[{"role": "user", "content": t}] for t in texts()]
        assert prepared.dataset["prompt"] == turns
        assert prepared.dataset["input_ids"] == [chat_ids(tok, c) for c in turns]
        assert "wrapped as user turns" in prepared.summary and f"chat_template {mode}" in prepared.summary
    else:
        assert prepared.dataset["prompt"] == texts()
        assert prepared.dataset["input_ids"] == [tok(text=t)["input_ids"] for t in texts()]
        assert "used as they are, no chat template" in prepared.summary


def test_modes_that_cannot_work_are_refused_in_one_line(tokenizers):
    from trl_ext.data.prompt_files import prepare_prompts
    from trl_ext.errors import InputError

    cases = [
        ("plain", RECIPE / "prompts.jsonl", "auto", f"{RECIPE / 'prompts.jsonl'}:1: a conversation, but the tokenizer"),
        ("plain", RECIPE / "prompts_plain.txt", "always", "chat_template 'always', but the tokenizer"),
        ("chat", RECIPE / "prompts.jsonl", "never", "the prompts are conversations"),
        ("chat", RECIPE / "prompts.jsonl", "sometimes", "chat_template must be one of auto, always, never"),
    ]
    for name, path, mode, message in cases:
        with pytest.raises(InputError) as caught:
            prepare_prompts(path, tokenizers[name], chat_template=mode)
        assert message in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_truncation_cuts_on_the_left_in_one_place_for_both_formats(tokenizers):
    from trl_ext.data.prompt_dataset import Truncation, truncate_prompts
    from trl_ext.data.prompt_files import prepare_prompts

    tok = tokenizers["chat"]
    full = [chat_ids(tok, c) for c in conversations()]
    prepared = prepare_prompts(RECIPE / "prompts.jsonl", tok, max_length=40)
    assert prepared.dataset["input_ids"] == [ids[-40:] for ids in full]  # the generation prompt survives
    assert prepared.truncation == Truncation(cut=8, total=8, most=max(len(i) for i in full) - 40)
    raw = [tok(text=t)["input_ids"] for t in texts()]
    prepared = prepare_prompts(RECIPE / "prompts_plain.txt", tok, chat_template="never", max_length=40)
    assert prepared.dataset["input_ids"] == [ids[-40:] for ids in raw]
    cut = [len(i) - 40 for i in raw if len(i) > 40]
    assert prepared.truncation == Truncation(cut=len(cut), total=8, most=max(cut))
    assert truncate_prompts([[1, 2, 3], [4]], 2) == ([[2, 3], [4]], Truncation(1, 2, 1))
    assert truncate_prompts([[1, 2, 3]], None) == ([[1, 2, 3]], Truncation(0, 1, 0))


# ------------------------------------------------------------------ malformed files

MALFORMED = [
    ('{"prompt": "ok"}\n{"text": "no prompt"}\n', 2, "expected 'prompt' as non-empty text or a list"),
    ('{"prompt": "ok"}\n\n{"prompt": "  "}\n', 3, "expected 'prompt' as non-empty text"),
    ('{"prompt": 7}\n', 1, "expected 'prompt' as non-empty text"),
    ('{"prompt": []}\n', 1, "expected 'prompt' as non-empty text"),
    (
        '{"prompt": [{"role": "user", "content": "hi"}]}\n{"prompt": [{"role": "user"}]}\n',
        2,
        "message 0 of 'prompt' is {'role': 'user'}",
    ),
    ('{"prompt": [{"role": "user", "content": "hi"}, "hello"]}\n', 1, "message 1 of 'prompt' is 'hello'"),
    (
        '{"prompt": [{"role": "user", "content": "hi"}]}\n{"prompt": "text"}\n',
        2,
        "mixes text and conversations (line 1 is a conversation)",
    ),
    ('{"prompt": "ok"}\n{"prompt": "a", "input_ids": [1]}\n', 2, "the field 'input_ids' is reserved"),
    ('{"prompt": "ok"}\n{"prompt": \n', 2, "not valid JSON"),
    ('["prompt"]\n', 1, "expected a JSON object"),
]


@pytest.mark.parametrize("text, line, message", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_rows_are_one_line_naming_file_and_line(tmp_path, text, line, message):
    from trl_ext.data.prompt_files import read_prompt_file
    from trl_ext.errors import InputError

    path = tmp_path / "prompts.jsonl"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        read_prompt_file(path)
    assert str(caught.value).startswith(f"{path}:{line}: ") and message in str(caught.value), caught.value
    assert "\n" not in str(caught.value)


def test_rlhf_refuses_bad_prompts_before_anything_runs(models, tmp_path, capsys):
    from trl_ext.commands.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": [{"role": "user", "content": "hi"}]}\n{"prompt": [{"role": "user", "content": 3}]}\n')
    cases = [
        (models["plain"], RECIPE / "prompts.jsonl", [], f"{RECIPE / 'prompts.jsonl'}:1: a conversation, but"),
        (models["chat"], bad, [], f"{bad}:2: message 0 of 'prompt'"),
        (models["plain"], RECIPE / "prompts_plain.txt", ["--chat-template", "always"], "chat_template 'always'"),
        (models["chat"], RECIPE / "prompts.jsonl", ["--chat-template", "never"], "the prompts are conversations"),
        # SFT renders conversations with the policy's own template; --tool-template is PPO's
        (
            models["plain"],
            RECIPE / "prompts_plain.txt",
            ["--sft-data", str(RECIPE / "sft_chat.jsonl"), "--tool-template", "qwen2_5"],
            "the SFT rows are conversations, but the tokenizer",
        ),
    ]
    # the doubling policy's WordLevel vocabulary has no unknown token: a word outside it cannot be encoded
    from trl_ext.tasks.doubling.artifacts import save_artifact
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.tokenizer import build_tokenizer

    doubling = build_tokenizer()
    save_artifact(build_policy(doubling), doubling, tmp_path / "doubling")
    capsys.readouterr()  # what saving printed
    (tmp_path / "words.txt").write_text("S数字:12x2=\nhello\n")
    cases.append((tmp_path / "doubling", tmp_path / "words.txt", [], f"{tmp_path / 'words.txt'}:2: the tokenizer"))
    for number, (policy, prompts, extra, message) in enumerate(cases):
        out = tmp_path / f"o{number}"
        code = main(
            [
                "rlhf",
                "--policy",
                str(policy),
                "--reward-fn",
                RECORDER,
                "--prompts",
                str(prompts),
                "--out",
                str(out),
                *extra,
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not out.exists(), (extra, err)


# ------------------------------------------------------------------ the reward functions' view


def test_trl_backend_adapter_hands_the_conversation_and_an_assistant_message(tokenizers, tmp_path, monkeypatch):
    """The adapter that plays TRL PPO's reward model: no TRL PPO needed to check what it hands on."""
    from trl_ext.data.prompt_files import prepare_prompts
    from trl_ext.trl_compat.reward_model import as_ppo_reward_model

    tok = tokenizers["chat"]
    record = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAT_PROMPTS_RECORD", str(record))
    from chat_prompt_rewards import record as recording_reward

    dataset = prepare_prompts(RECIPE / "prompts.jsonl", tok).dataset
    answer = tok(text="Blue light scatters.")["input_ids"] + [tok.eos_token_id]
    rows = [dataset["input_ids"][0] + answer, [tok.pad_token_id] * 3 + dataset["input_ids"][1] + answer]
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    model = as_ppo_reward_model(recording_reward, tok, dataset)
    model.reward_backbone(input_ids=ids, attention_mask=ids != tok.pad_token_id)
    call = json.loads(record.read_text())
    assert call["prompts"] == conversations()[:2]
    assert call["completions"] == [[{"role": "assistant", "content": tok.decode(answer, skip_special_tokens=True)}]] * 2


def test_classifier_reward_scores_a_single_user_turn_as_its_text_pair(models):
    """A DeBERTa-style reward model (no chat template) scores (prompt, completion) conversations as the text pair
    of their contents: the same score as the standard prompt."""
    from trl_ext.rewards import ClassifierReward

    scorer = ClassifierReward.from_pretrained(models["deberta"], pair=True)
    prompts, answers = ["Why is the sky blue?", "Name a bakery."], ["Scattering.", "Crumbs."]
    as_text = scorer(prompts, answers)
    as_chat = scorer(
        [[{"role": "user", "content": p}] for p in prompts], [[{"role": "assistant", "content": a}] for a in answers]
    )
    assert as_chat == as_text


def _run_rlhf(policy, prompts, out, record, monkeypatch, capsys, *extra):
    from trl_ext.commands.cli import main

    monkeypatch.setenv("CHAT_PROMPTS_RECORD", str(record))
    code = main(
        [
            "rlhf",
            "--policy",
            str(policy),
            "--reward-fn",
            RECORDER,
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            *TINY_RUN,
            *extra,
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    return captured.out.splitlines(), calls, json.loads((out / "summary.json").read_text())


def _assert_conversational_calls(calls, expected_prompts, tok):
    seen = [p for call in calls for p in call["prompts"]]
    assert seen == expected_prompts[: len(seen)] and len(seen) == 4  # two updates of two prompts, in file order
    for call in calls:
        for completion, ids in zip(call["completions"], call["completion_ids"] or [None] * 2):
            assert isinstance(completion, list) and len(completion) == 1 and completion[0]["role"] == "assistant"
            assert isinstance(completion[0]["content"], str)
            if ids is not None:
                assert completion[0]["content"] == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("backend", ["scratch", pytest.param("trl", marks=pytest.mark.needs_trl_ppo)])
def test_rlhf_on_a_chat_model_samples_through_its_template(models, tokenizers, tmp_path, monkeypatch, capsys, backend):
    tok = tokenizers["chat"]
    received = []
    if backend == "scratch":  # what the policy is given, batch by batch
        from trl_ext.ppo.trainer import PPOTrainer

        step = PPOTrainer.train_step
        monkeypatch.setattr(
            PPOTrainer,
            "train_step",
            lambda self, rows, *more: received.extend(rows["input_ids"]) or step(self, rows, *more),
        )
    out = tmp_path / backend
    prompts = write_jsonl(
        tmp_path / "prompts.jsonl",
        [
            {"prompt": c, "answer": str(i)}  # a column, as GRPO has
            for i, c in enumerate(conversations())
        ],
    )
    lines, calls, summary = _run_rlhf(
        models["chat"], prompts, out, tmp_path / "calls.jsonl", monkeypatch, capsys, "--backend", backend
    )
    assert lines[0] == (
        f"[prompts] 8 conversations from {prompts}, rendered with the policy's chat template (generation prompt added)"
    )
    assert summary["updates"] == 2 and summary["first_score"] == pytest.approx(0.5)
    _assert_conversational_calls(calls, conversations(), tok)
    assert [a for call in calls for a in call["columns"]["answer"]] == ["0", "1", "2", "3"]
    if backend == "scratch":
        assert received == [chat_ids(tok, c) for c in conversations()[:4]]


def test_rlhf_auto_wraps_plain_prompts_for_a_chat_model_and_scores_them_with_a_reward_model(
    models, tokenizers, tmp_path, monkeypatch, capsys
):
    """auto on a chat model: text lines become user turns for the policy and the reward function; the DeBERTa
    reward model (no template) scores them beside it."""
    lines, calls, summary = _run_rlhf(
        models["chat"],
        RECIPE / "prompts_plain.txt",
        tmp_path / "o",
        tmp_path / "calls.jsonl",
        monkeypatch,
        capsys,
        "--reward",
        str(models["deberta"]),
    )
    assert lines[0].endswith(
        "wrapped as user turns and rendered with the chat template: chat_template auto (the tokenizer has one)"
    )
    _assert_conversational_calls(calls, [[{"role": "user", "content": t}] for t in texts()], tokenizers["chat"])
    assert summary["updates"] == 2 and summary["first_score"] is not None


@pytest.mark.parametrize("backend", ["scratch", pytest.param("trl", marks=pytest.mark.needs_trl_ppo)])
def test_rlhf_on_a_model_without_template_uses_the_text(models, tokenizers, tmp_path, monkeypatch, capsys, backend):
    tok = tokenizers["plain"]
    received = []
    if backend == "scratch":
        from trl_ext.ppo.trainer import PPOTrainer

        step = PPOTrainer.train_step
        monkeypatch.setattr(
            PPOTrainer,
            "train_step",
            lambda self, rows, *more: received.extend(rows["input_ids"]) or step(self, rows, *more),
        )
    lines, calls, summary = _run_rlhf(
        models["plain"],
        RECIPE / "prompts_plain.txt",
        tmp_path / backend,
        tmp_path / "calls.jsonl",
        monkeypatch,
        capsys,
        "--backend",
        backend,
    )
    assert lines[0] == (
        f"[prompts] 8 plain-text lines from {RECIPE / 'prompts_plain.txt'}, used as they are, "
        "no chat template: chat_template auto (the tokenizer has none)"
    )
    assert summary["updates"] == 2
    seen = [p for call in calls for p in call["prompts"]]
    completions = [c for call in calls for c in call["completions"]]
    assert len(seen) == 4 and all(isinstance(c, str) for c in completions)
    if backend == "scratch":
        assert seen == texts()[:4]
        assert received == [tok(text=t)["input_ids"] for t in texts()[:4]]
    else:  # TRL's adapter decodes the prompt tokens it finds
        assert seen == [tok.decode(tok(text=t)["input_ids"]) for t in texts()[:4]]


# ------------------------------------------------------------------ SFT and preference stages


def test_stage_files_in_another_format_than_the_prompts_get_a_note(models, tmp_path):
    from trl_ext.runs.rlhf import load_prompts
    from trl_ext.runs.rlhf_options import PromptOptions, RLHFStages

    _, lines = load_prompts(
        PromptOptions(prompts=str(RECIPE / "prompts.jsonl")),
        RLHFStages(sft_data=str(RECIPE / "sft.jsonl"), preferences=str(RECIPE / "preferences.jsonl")),
        str(models["chat"]),
    )
    assert len(lines) == 2 and lines[1].startswith(
        f"[prompts] note: --sft-data {RECIPE / 'sft.jsonl'} and --preferences {RECIPE / 'preferences.jsonl'} hold text"
    )
    _, lines = load_prompts(
        PromptOptions(prompts=str(RECIPE / "prompts.jsonl")),
        RLHFStages(sft_data=str(RECIPE / "sft_chat.jsonl"), preferences=str(RECIPE / "preferences_chat.jsonl")),
        str(models["chat"]),
    )
    assert len(lines) == 1


def test_the_tool_template_counts_before_any_stage_as_ppo_will_use_it(models):
    """A policy without a chat template, given one by --tool-template: its conversations are accepted before any
    stage, and the line printed says they go through the template, as PPO will render them."""
    from trl_ext.errors import InputError
    from trl_ext.runs.rlhf import load_prompts
    from trl_ext.runs.rlhf_options import PromptOptions, RLHFStages

    conversations, text = (
        PromptOptions(prompts=str(RECIPE / "prompts.jsonl")),
        PromptOptions(prompts=str(RECIPE / "prompts_plain.txt")),
    )
    with pytest.raises(InputError, match="a conversation, but the tokenizer"):
        load_prompts(conversations, RLHFStages(), str(models["plain"]))
    _, lines = load_prompts(conversations, RLHFStages(), str(models["plain"]), tool_template="qwen2_5")
    assert lines[0].endswith("rendered with the policy's chat template (generation prompt added)")
    _, lines = load_prompts(text, RLHFStages(), str(models["plain"]), tool_template="qwen2_5")
    assert "wrapped as user turns and rendered with the chat template: chat_template auto" in lines[0]


def test_conversational_stage_rows_are_checked_like_prompts():
    from datasets import Dataset

    from trl_ext.stages.preferences import PreferenceError, check_preferences
    from trl_ext.stages.sft import SFTDataError, check_sft_rows

    user, answer = [{"role": "user", "content": "hi"}], [{"role": "assistant", "content": "hello"}]
    assert check_sft_rows(Dataset.from_list([{"prompt": user, "completion": answer}]))
    assert check_sft_rows(Dataset.from_list([{"messages": user + answer}]))
    assert not check_sft_rows(Dataset.from_list([{"text": "hi hello"}]))
    with pytest.raises(SFTDataError, match=r"row 0: message 0 of 'completion' is 'hello'"):
        check_sft_rows(Dataset.from_dict({"prompt": [user], "completion": [["hello"]]}))
    assert check_preferences(
        Dataset.from_list([{"chosen": user + answer, "rejected": user + [{**answer[0], "content": "no"}]}])
    )
    with pytest.raises(PreferenceError, match=r"row 0: without a 'prompt', 'chosen' needs the prompt's messages"):
        check_preferences(Dataset.from_list([{"chosen": answer, "rejected": [{**answer[0], "content": "no"}]}]))


@pytest.mark.trl_api  # TRL's SFTTrainer and RewardTrainer
def test_rlhf_pipeline_on_conversational_sft_and_preference_rows(models, tmp_path, monkeypatch, capsys):
    """SFT on conversational prompt/completion rows (chat template), a reward model from conversational
    preferences on a DeBERTa base without template (scored as text pairs, as ClassifierReward scores such
    conversations), then PPO through the template."""
    lines, calls, summary = _run_rlhf(
        models["chat"],
        RECIPE / "prompts.jsonl",
        tmp_path / "o",
        tmp_path / "calls.jsonl",
        monkeypatch,
        capsys,
        "--sft-data",
        str(RECIPE / "sft_chat.jsonl"),
        "--sft-steps",
        "2",
        "--preferences",
        str(RECIPE / "preferences_chat.jsonl"),
        "--reward-base",
        str(models["deberta"]),
        "--reward-steps",
        "2",
        "--reward-eval-n",
        "4",
        "--stage-batch-size",
        "4",
    )
    assert not any("note:" in line for line in lines)
    stage = json.loads((tmp_path / "o" / "reward_model" / "stage.json").read_text())
    recounted = _heldout_accuracy_recounted(tmp_path / "o" / "reward_model", RECIPE / "preferences_chat.jsonl", 4)
    assert stage["heldout_pairs"] == 4 and stage["heldout_pairwise_accuracy"] == recounted
    assert summary["updates"] == 2 and summary["first_score"] is not None
    assert [p for call in calls for p in call["prompts"]] == conversations()[:4]


@pytest.mark.trl_api
def test_reward_model_on_conversations_with_a_chat_template_scores_as_it_trained(models, tmp_path):
    """Implicit-prompt conversational preferences on a chat-template base: trained on the rendered conversation,
    scored on the same tokens (prompt = the messages before the answer)."""
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trl_ext.stages.reward_model import score_pairs, tokenize_preferences, train_reward_model

    rows = [json.loads(line) for line in (RECIPE / "preferences_chat.jsonl").read_text().splitlines()]
    data = Dataset.from_list(
        [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in rows]
    )
    tok = AutoTokenizer.from_pretrained(models["chat"])
    model = AutoModelForSequenceClassification.from_pretrained(models["chat"], num_labels=1, dtype=torch.float32)
    history = train_reward_model(
        model, tok, data, output_dir=str(tmp_path / "rm"), steps=2, batch_size=4, learning_rate=1e-3
    )
    assert any("loss" in h for h in history)
    ids = tokenize_preferences(data, tok)["chosen_ids"][0]
    assert ids == list(tok.apply_chat_template(data["chosen"][0], tokenize=True, return_dict=True)["input_ids"])
    model.eval()
    with torch.no_grad():
        direct = model(input_ids=torch.tensor([ids])).logits[0, 0].item()
    chosen, rejected = score_pairs(model, tok, data.select([0]))
    assert chosen[0] == pytest.approx(direct, abs=1e-5) and len(rejected) == 1


@pytest.mark.trl_api
@pytest.mark.parametrize(
    "row",
    [
        {"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello you"}]},
        {"text": "hi there hello you"},
    ],
    ids=["messages", "text"],
)
def test_sft_takes_trl_language_modeling_rows(models, tmp_path, row):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.stages.sft import supervised_finetune

    policy = models["chat"]
    _, history = supervised_finetune(
        AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32),
        AutoTokenizer.from_pretrained(policy),
        Dataset.from_list([row] * 4),
        output_dir=str(tmp_path),
        steps=2,
        batch_size=2,
        learning_rate=1e-3,
    )
    assert len([h for h in history if "loss" in h]) == 2


@pytest.mark.needs_trl_ppo
def test_trl_backend_on_a_chat_model_padded_with_its_eos(models, tokenizers, tmp_path, monkeypatch, capsys):
    # SmolLM2 and Qwen instruct checkpoints pad with <|im_end|>, which ends every turn of a chat prompt; TRL 1.12's
    # PPO drops pad ids from queries, so the run pads with another special token and saves the user's tokenizer.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.trl_compat.backend import pad_outside_queries

    policy = tmp_path / "eos_padded"
    AutoModelForCausalLM.from_pretrained(models["chat"]).save_pretrained(policy)
    tok = AutoTokenizer.from_pretrained(models["chat"])
    tok.pad_token = tok.eos_token
    tok.save_pretrained(policy)
    queries = [chat_ids(tok, c) for c in conversations()]
    trl_tok = pad_outside_queries(tok, queries)
    assert trl_tok is not tok and tok.pad_token == "<|im_end|>" and trl_tok.pad_token != "<|im_end|>"
    assert trl_tok.pad_token_id not in {t for q in queries for t in q} and trl_tok.eos_token == "<|im_end|>"
    assert pad_outside_queries(trl_tok, queries) is trl_tok  # nothing to change
    _, calls, summary = _run_rlhf(
        policy,
        RECIPE / "prompts.jsonl",
        tmp_path / "out",
        tmp_path / "calls.jsonl",
        monkeypatch,
        capsys,
        "--backend",
        "trl",
    )
    _assert_conversational_calls(calls, conversations(), tok)
    assert summary["updates"] == 2
    assert AutoTokenizer.from_pretrained(tmp_path / "out").pad_token == "<|im_end|>"


def test_trl_backend_without_a_spare_pad_token_says_so(tokenizers):
    from trl_ext.errors import InputError
    from trl_ext.trl_compat.backend import pad_outside_queries

    tok = tokenizers["chat"]
    every_special = [tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens] + [tok.pad_token_id]
    with pytest.raises(
        InputError,
        match=re.escape(
            "TRL 1.12's PPO drops the pad token from queries, and the pad token '<|endoftext|>' occurs in the prompts;"
        ),
    ):
        pad_outside_queries(tok, [every_special])


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_trl_ppos_reward_adapter_decodes_a_conversations_answer_as_told(models, skip_special_tokens):
    """TRL's PPO row hands the reward one assistant message, its eos kept only where skip_special_tokens is False,
    as the scratch trainer does."""
    from transformers import AutoTokenizer

    from trl_ext.data.prompt_files import prepare_prompts
    from trl_ext.trl_compat.reward_model import as_ppo_reward_model

    tok = AutoTokenizer.from_pretrained(models["chat"])
    dataset = prepare_prompts(RECIPE / "prompts.jsonl", tok).dataset
    received = []

    def record(prompts, completions, **_):
        received.extend(completions)
        return [0.0] * len(completions)

    ids = torch.tensor([dataset["input_ids"][0] + tok(text="hello", add_special_tokens=False)["input_ids"]])
    ids = torch.cat([ids, torch.tensor([[tok.eos_token_id]])], 1)
    module = as_ppo_reward_model(record, tok, dataset, skip_special_tokens)
    module.reward_backbone(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert received == [[{"role": "assistant", "content": "hello" if skip_special_tokens else "hello" + tok.eos_token}]]


def _heldout_accuracy_recounted(folder, preferences, eval_n: int) -> float:
    """The saved reward model's share of the held-out pairs (the file's last ``eval_n``) scored chosen above
    rejected, as PPO scores them."""
    from trl_ext.models.loading import load_sequence_classifier
    from trl_ext.stages.preferences import preference_split
    from trl_ext.stages.reward_model import score_pairs

    _, heldout = preference_split(preferences, eval_n)
    chosen, rejected = score_pairs(*load_sequence_classifier(folder, "reward model"), heldout)
    return sum(c > r for c, r in zip(chosen, rejected, strict=True)) / eval_n
