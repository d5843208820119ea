import pytest

from trl_ext.errors import InputError
from trl_ext.tasks.doubling import task as d


def test_vocab_is_the_seeds_42_characters_in_order(tokenizer):
    assert len(d.VOCAB) == 42 and len(set(d.VOCAB)) == 42
    assert tokenizer.convert_tokens_to_ids(["P", "S", "E", "0", "〇", "零", "x"]) == [0, 1, 2, 3, 13, 23, 41]
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)


def test_tokenizer_round_trip_and_reload(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    text = "S大写:3164x2=陆叁贰捌E"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    tokenizer.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text, add_special_tokens=False)["input_ids"] == ids
    assert again.decode(ids) == text
    assert again.padding_side == "left"


def test_unknown_character_is_named_with_position(tokenizer):
    with pytest.raises(ValueError, match=r"'A' at position 2"):
        d.check_text("S数A:1")
    with pytest.raises(Exception, match="UNK"):  # the raw tokenizer refuses too: never a silent UNK
        tokenizer("S数A:1")


def test_samples_are_correct_and_deterministic():
    a = d.generate_samples(50, seed=3, prefixed=True)
    assert a == d.generate_samples(50, seed=3, prefixed=True)
    assert a != d.generate_samples(50, seed=4, prefixed=True)
    for s in a:
        assert d.parse_prompt(s.prompt).question == s.question and d.parse_prompt(s.prompt).label == s.label
        assert d.parse_answer(s.answer).value == 2 * s.question and d.parse_answer(s.answer).charset == s.label
    assert d.Sample(3320, 0, True).text == "S数字:3320x2=6640E"
    assert d.Sample(3320, 1, False).text == "S__:3320x2=六六四〇E"
    assert d.Sample(3164, 2, True).answer == "陆叁贰捌E"


def test_splits_do_not_share_questions():
    assert not set(d.TRAIN_QUESTIONS) & set(d.HELD_OUT_QUESTIONS)
    assert len(d.HELD_OUT_QUESTIONS) == 1000 and len(d.TRAIN_QUESTIONS) == 8000
    train = {s.question for s in d.generate_samples(3000, 0, "train")}
    held = {s.question for s in d.heldout_prompts(1000)}
    assert len(held) == 1000 and not train & held


def test_dataset_schemas(tokenizer):
    pre = d.pretrain_dataset(tokenizer, 8, 0)
    assert pre.column_names == ["text", "input_ids"] and all(t[1:3] in ("__", *d.PREFIXES) for t in pre["text"])
    cls = d.classifier_dataset(tokenizer, 8, 0)
    assert set(cls.column_names) == {"text", "input_ids", "label"} and set(cls["label"]) <= {0, 1, 2, d.MIXED_LABEL}
    prompts = d.ppo_prompt_dataset(tokenizer, 8, 0)
    assert set(prompts.column_names) == {"prompt", "input_ids", "label", "question", "answer"}
    for row in prompts:
        assert row["prompt"].endswith("=") and tokenizer.decode(row["input_ids"]) == row["prompt"]
        assert row["answer"] == d.expected_answer(row["question"], row["label"])
    assert d.ppo_prompt_dataset(tokenizer, 8, 0)["prompt"] == prompts["prompt"]


def test_pretraining_prefixes_say_nothing_of_the_answers_set(tokenizer):
    """Half the pretraining rows carry a prefix, drawn apart from the answer's set: every prefix is followed by every
    set about equally often, so the policy learns to double after a prefix and PPO still teaches it to obey one."""
    texts = d.pretrain_dataset(tokenizer, 3000, 0)["text"]
    prefixed = [t for t in texts if t[1:3] in d.PREFIXES]
    assert 0.45 < len(prefixed) / len(texts) < 0.55
    for prefix in d.PREFIXES:
        sets = [d.parse_answer(t.split("=", 1)[1]).charset for t in prefixed if t[1:3] == prefix]
        assert all(0.25 < sets.count(label) / len(sets) < 0.42 for label in range(3)), prefix
    assert d.pretrain_dataset(tokenizer, 50, 0, prefixed_share=0.0)["text"] == [
        s.text for s in d.generate_samples(50, 0)
    ]


def test_mixed_answers_hold_the_value_in_two_sets(tokenizer):
    """The classifier's fourth class: the right number, written partly in another set (a quarter of its rows)."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        question, label = rng.randrange(1000, 10000), rng.randrange(3)
        parsed = d.parse_answer(d.mixed_answer(question, label, rng))
        assert parsed.value == 2 * question and parsed.finished and parsed.charset is None
    labels = d.classifier_dataset(tokenizer, 2000, 0)["label"]
    assert 0.2 < labels.count(d.MIXED_LABEL) / 2000 < 0.3
    pure = d.classifier_dataset(tokenizer, 2000, 0, mixed_share=0.0)
    assert set(pure["label"]) == {0, 1, 2}


def test_datasets_hold_the_tokenizers_own_ids(tokenizer):
    """The task's tokenizer is read by a dict lookup (fast); the ids must be the ones the tokenizer gives."""
    for data, column in (
        (d.classifier_dataset(tokenizer, 300, 1), "text"),
        (d.pretrain_dataset(tokenizer, 300, 1), "text"),  # '__' and prefixed texts
        (d.ppo_prompt_dataset(tokenizer, 300, 1), "prompt"),
    ):
        assert data["input_ids"] == tokenizer(list(data[column]), add_special_tokens=False)["input_ids"]
    with pytest.raises(InputError, match="'A' at position 3"):
        d._tokenize(tokenizer, ["S__A:1"])


@pytest.mark.parametrize(
    "completion, value, charset, finished",
    [
        ("6640E", 6640, 0, True),  # correct
        ("六六四〇E", 6640, 1, True),  # wrong set for a digits prompt, right value
        ("6641E", 6641, 0, True),  # wrong value
        ("6640", 6640, 0, False),  # missing E
        ("6六40E", 6640, None, True),  # mixed sets
        ("E", None, None, True),  # empty
        ("x=E", None, None, True),  # garbage
    ],
)
def test_parse_answer(completion, value, charset, finished):
    parsed = d.parse_answer(completion)
    assert (parsed.value, parsed.charset, parsed.finished) == (value, charset, finished)


def test_parse_prompt_rejects_malformed():
    with pytest.raises(ValueError, match="malformed"):
        d.parse_prompt("S数字:33a0x2=")
    with pytest.raises(ValueError, match="unknown prefix"):
        d.parse_prompt("S数大:3320x2=")
