"""The real model's tool task (trl_ext.tasks.real_model.tool_task): the splits are fixed and disjoint, the code
is only the environment's, the reward grades the final answer, and the warm start's SFT rows render exactly what a
rollout holds (the prompt with the tools' schemas, the call as Qwen2.5's template writes it, the answer)."""

import itertools
import json

import pytest
from tool_models import call_text, tool_tokenizer

from trl_ext.agents.tools import ToolResult
from trl_ext.tasks.real_model import tool_task as tt


def test_the_held_out_names_are_fixed_and_never_trained_on():
    held = tt.heldout_names()
    assert len(held) == tt.HELDOUT_NAMES and held == tt.heldout_names()
    assert not set(held) & set(tt.train_names()) and len(held) + len(tt.train_names()) == len(tt.NAMES)
    rows = tt.heldout_rows()
    assert len(rows) == 32 and rows == tt.heldout_rows() and {r["name"] for r in rows} == set(held)
    stream = list(itertools.islice(tt.train_stream(3), 100))
    assert stream == list(itertools.islice(tt.train_stream(3), 100)) != list(itertools.islice(tt.train_stream(4), 100))
    assert not {r["name"] for r in stream} & set(held)
    assert all(len(r["code"]) == 4 and r["code"].isdigit() and r["name"] in r["prompt"][0]["content"] for r in stream)


def test_the_test_split_is_fixed_and_apart_from_every_other_name():
    test = tt.eval_rows("test")
    assert len(test) == 32 and test == tt.eval_rows("test") and tt.eval_rows("heldout") == tt.heldout_rows()
    names = {r["name"] for r in test}
    assert len(names) == 16 and not names & set(tt.NAMES)  # neither trained on nor used to choose a setting
    assert len({r["code"] for r in test}) > 16 and all(len(r["code"]) == 4 and r["code"].isdigit() for r in test)
    assert [(r["name"], r["code"]) for r in test[:3]] == [
        ("Amara", "6764"),
        ("Boris", "2024"),
        ("Chloe", "8048"),
    ]  # pinned
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        tt.eval_rows("dev")


def test_the_code_is_the_environments_and_the_per_turn_reward_comes_once():
    env = tt.SecretCodes()
    env.reset(**tt.heldout_rows()[0])
    assert env.lookup_code(env.name.upper()) == env.code
    with pytest.raises(KeyError, match="no secret code"):
        env.lookup_code("Nobody")
    per_turn = tt.SecretCodesPerTurn()
    per_turn.reset(name="Maria", code="1234", prompt=[])
    assert per_turn.lookup_code("Maria") == ToolResult("1234", tt.LOOKUP_REWARD)
    assert per_turn.lookup_code("Maria") == ToolResult("1234", 0.0)


def test_right_code_grades_the_final_assistant_turn():
    call = {"role": "assistant", "content": "", "tool_calls": [tt.tool_call("Maria")]}
    tool = {"role": "tool", "name": "lookup_code", "content": "1234"}
    completions = [
        [call, tool, {"role": "assistant", "content": "1234"}],
        [call, tool, {"role": "assistant", "content": "The code is 1234."}],
        [call, tool, {"role": "assistant", "content": "1234 or 4321"}],
        [call, tool],  # ended on the tool's result
        [{"role": "assistant", "content": "4321"}],
    ]
    assert tt.right_code(completions, ["1234"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_the_sft_rows_render_what_a_rollout_holds():
    from datasets import Dataset

    tok = tool_tokenizer()
    rows = Dataset.from_list(tt.sft_rows(4, seed=0))  # through arrow, as the SFT stage reads them
    assert len(rows) == 8
    tools = [tt.SecretCodes().lookup_code]
    for call_row, answer_row in zip(rows.select(range(0, 8, 2)), rows.select(range(1, 8, 2))):
        schemas = json.loads(call_row["tools"])
        name = call_row["prompt"][0]["content"].split("'")[0].split()[-1]
        prompt = tok.apply_chat_template(call_row["prompt"], tools=tools, add_generation_prompt=True, tokenize=False)
        whole = tok.apply_chat_template(call_row["prompt"] + call_row["completion"], tools=schemas, tokenize=False)
        assert whole.startswith(prompt + call_text("lookup_code", {"name": name}) + "<|im_end|>")
        assert name not in tt.heldout_names()
        code = answer_row["completion"][0]["content"]
        answer = tok.apply_chat_template(answer_row["prompt"] + answer_row["completion"], tools=schemas, tokenize=False)
        assert answer.startswith(whole.rstrip("\n")) and answer.rstrip("\n").endswith(f"{code}<|im_end|>")
        assert f"<tool_response>\n{code}\n</tool_response>" in answer
