"""A tool task for SmolLM2-135M-Instruct: each person's secret code is held by the environment alone.

A prompt asks for one person's code::

    {"prompt": [{"role": "user", "content": "What is Maria's secret code? Answer with just the code."}],
     "name": "Maria", "code": "4821"}

The code is four random digits drawn for each row, so no model can know it: the only way to the answer is the
environment's tool ``lookup_code(name)``, which returns the code of the row's person (and an error for anyone
else). ``right_code`` is the reward function (it sees the answer; TRL's ``get_reward()`` would not): 1.0 when the
final assistant turn holds the code and no other number, else 0. A guess is right 1 time in 9,000.

Splits: 48 first names, 16 of them held out for good (``heldout_rows``: each held-out name with two fixed codes,
32 prompts); the training stream (``train_stream(seed)``) draws the other 32 names with fresh codes. The held-out
set chose the warm start's length; the test split (``eval_rows("test")``: 16 further names, in no other split, two
fixed codes each) judges runs whose settings were fixed before it was first used.

SmolLM2 speaks plain ChatML with no tool support: the task gives its tokenizer TRL's Qwen2.5 tool template by
name (``tool_tokenizer``, ``trl_ext.agents.with_tool_template``), never silently. The base model writes no
parseable tool call in that template (issue 43 measured 0 of 32 with TRL 1.16), so RL alone cannot start:
``sft_rows`` makes the warm start, tool-calling conversations for the ``rlhf`` pipeline's SFT stage, two rows per
conversation so the loss covers the model's turns only (the call; the answer after the tool's result).

Two environments: ``SecretCodes`` returns the code as plain text (TRL's interface: the same class serves TRL's
GRPOTrainer), ``SecretCodesPerTurn`` returns it as ``ToolResult(code, reward=LOOKUP_REWARD)`` for the first right
lookup of a rollout, a per-turn reward that trl-ext's critic credits to the calling turn.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import re
from collections.abc import Iterator

from trl_ext.agents.tools import ToolResult
from trl_ext.tasks.real_model.splits import by_name, held_out, rest

NAMES = (
    "Maria Ahmed John Sofia Liam Emma Noah Olivia Lucas Mia Ethan Ava Mateo Zoe Omar Leila Ivan Nina Hugo "
    "Clara Felix Rosa Oscar Elena Samir Yuki Pablo Greta Tomas Irene Victor Alma Bruno Ines Dmitri Hana Kofi "
    "Lena Marco Nora Pedro Sara Tariq Vera Wanda Xavier Yara Ziad"
).split()
HELDOUT_NAMES = 16
SPLIT_SEED = 43  # fixes the held-out names and codes for good
CODES_PER_HELDOUT_NAME = 2
# The test split: names in no other split (nor in NAMES, whose order fixes the held-out draw), codes of their own.
TEST_NAMES = "Amara Boris Chloe Daniel Esme Farid Gemma Henrik Isla Jonas Kira Lars Mina Nikolai Priya Rafael".split()
TEST_SPLIT_SEED = 47
INSTRUCTION = "Answer with just the code."
QUESTION = "What is {name}'s secret code? " + INSTRUCTION
LOOKUP_REWARD = 0.5  # the per-turn reward of the first right lookup (SecretCodesPerTurn)
_NUMBER = re.compile(r"\d+")


class SecretCodes:
    """The environment (TRL's interface): ``reset(name=..., code=...)`` from the row; ``lookup_code`` is its tool."""

    def __init__(self):
        self.name, self.code, self.lookups = None, None, 0

    def reset(self, name: str, code: str, **_) -> None:
        self.name, self.code, self.lookups = name, code, 0

    def lookup_code(self, name: str) -> str:
        """Look up a person's secret code.

        Args:
            name: The person's first name.

        Returns:
            The person's secret code.
        """
        if str(name).strip().lower() != self.name.lower():
            raise KeyError(f"no secret code on file for {name!r}")
        self.lookups += 1
        return self._result(self.code)

    def _result(self, code: str):
        return code


class SecretCodesPerTurn(SecretCodes):
    """``SecretCodes`` whose first right lookup of a rollout earns ``LOOKUP_REWARD`` for the turn that made it."""

    def _result(self, code: str):
        return ToolResult(code, reward=LOOKUP_REWARD if self.lookups == 1 else 0.0)


def answer_of(completion) -> str:
    """The text of a completion's final assistant turn ('' when the rollout ended on a tool message)."""
    if isinstance(completion, str):
        return completion
    last = completion[-1] if completion else {}
    return last.get("content") or "" if last.get("role") == "assistant" and not last.get("tool_calls") else ""


def code_is_right(completion, code: str) -> bool:
    return _NUMBER.findall(answer_of(completion)) == [str(code)]


def right_code(completions, code, **_) -> list[float]:
    """1.0 where the final assistant turn holds the row's code and no other number (a reward function, called as
    TRL calls them: ``completions`` as message lists, the ``code`` column, ``environments`` among the rest)."""
    return [1.0 if code_is_right(c, k) else 0.0 for c, k in zip(completions, code)]


def _row(name: str, code: str) -> dict:
    return {"prompt": [{"role": "user", "content": QUESTION.format(name=name)}], "name": name, "code": code}


def _code(rng: random.Random) -> str:
    return str(rng.randrange(1000, 10000))


def heldout_names() -> list[str]:
    return held_out(NAMES, HELDOUT_NAMES, SPLIT_SEED)


def train_names() -> list[str]:
    return rest(NAMES, heldout_names())


def heldout_rows() -> list[dict]:
    """The fixed held-out set: 16 names never trained on, two fixed codes each (32 prompts)."""
    rng = random.Random(SPLIT_SEED + 1)
    return [_row(n, _code(rng)) for _ in range(CODES_PER_HELDOUT_NAME) for n in heldout_names()]


def _test_rows() -> list[dict]:
    rng = random.Random(TEST_SPLIT_SEED)
    return [_row(n, _code(rng)) for _ in range(CODES_PER_HELDOUT_NAME) for n in TEST_NAMES]


SPLITS = {"heldout": heldout_rows, "test": _test_rows}


def eval_rows(split: str) -> list[dict]:
    """An evaluation split's 32 prompts: ``heldout`` (the selection set, ``heldout_rows()``) or ``test``."""
    return by_name(SPLITS, split)


def train_stream(seed: int) -> Iterator[dict]:
    """Endless training prompts: the training names reshuffled every pass, a fresh code for every row."""
    names, rng = train_names(), random.Random(seed)
    while True:
        order = list(names)
        rng.shuffle(order)
        for name in order:
            yield _row(name, _code(rng))


def train_dataset(n: int, seed: int):
    from datasets import Dataset

    return Dataset.from_list(list(itertools.islice(train_stream(seed), n)))


def tool_tokenizer(folder):
    """SmolLM2's tokenizer with TRL's Qwen2.5 tool template, chosen here by name (its own ChatML has no tools)."""
    from transformers import AutoTokenizer

    from trl_ext.agents import with_tool_template

    return with_tool_template(AutoTokenizer.from_pretrained(folder), "qwen2_5")


def tool_schemas() -> str:
    """The JSON schemas of the environment's tools, as a dataset's ``tools`` column holds them (TRL's SFT)."""
    from transformers.utils import get_json_schema

    return json.dumps([get_json_schema(SecretCodes().lookup_code)])


def tool_call(name: str) -> dict:
    return {"type": "function", "function": {"name": "lookup_code", "arguments": {"name": name}}}


def sft_rows(conversations: int, seed: int) -> list[dict]:
    """The warm start's data: ``conversations`` worked lookups on training names (fresh codes, seeded apart from
    the RL stream), each as two prompt/completion rows with the tools' schemas: the question -> the tool call;
    the question, the call and the tool's result -> the code. So the loss covers the model's turns only."""
    rows, schemas = [], tool_schemas()
    stream = train_stream(10_000 + seed)
    for row in itertools.islice(stream, conversations):
        call = {"role": "assistant", "content": "", "tool_calls": [tool_call(row["name"])]}
        result = {"role": "tool", "name": "lookup_code", "content": row["code"]}
        rows.append({"prompt": copy.deepcopy(row["prompt"]), "completion": [call], "tools": schemas})
        rows.append(
            {
                "prompt": row["prompt"] + [call, result],
                "completion": [{"role": "assistant", "content": row["code"]}],
                "tools": schemas,
            }
        )
    return rows


def hf_sampler(model, tokenizer, *, temperature: float, seed: int):
    """A ``run_turns`` sample function over HF ``generate`` (``generate_responses``: left-padded; greedy at
    temperature 0, else the whole distribution as the trainers sample): each query's new ids up to and including
    eos, each call seeded in turn from ``seed``."""
    import torch

    from trl_ext.data.batching import pad_batch
    from trl_ext.data.sequences import completion_token_ids, response_mask
    from trl_ext.ppo.rollout.interface import SamplingOptions
    from trl_ext.ppo.rollout.loop import generate_responses

    generator_seed = [seed]

    def sample(queries: list[list[int]], max_new_tokens: int):
        ids, attention = pad_batch(queries, tokenizer.pad_token_id, side="left")
        torch.manual_seed(generator_seed[0])
        generator_seed[0] += 1
        options = SamplingOptions(max_new_tokens, tokenizer.eos_token_id, tokenizer.pad_token_id, temperature)
        responses = generate_responses(model, ids.to(model.device), attention.to(model.device), options)
        return completion_token_ids(responses, response_mask(responses, tokenizer.eos_token_id)), None

    return sample


def score_tool_rows(
    model,
    tokenizer,
    rows: list[dict],
    *,
    temperature: float = 0.0,
    seed: int = 0,
    budget: int = 64,
    max_iterations: int = 1,
    batch_size: int = 32,
    examples: int = 3,
) -> dict:
    """Roll out ``rows`` through the tool loop (``trl_ext.agents.turns.run_turns``, the trainer's own) with HF
    generate: the held-out score (``right_code``), the share of rollouts whose first turn is a parseable tool call,
    of right lookups (the row's name), of malformed calls, and a few conversations."""
    import time

    from trl_ext.agents import templates
    from trl_ext.agents.tools import Toolbox, environment_tools
    from trl_ext.agents.turns import run_turns

    templates.prepare_tokenizer(tokenizer)
    model.eval()
    start = time.perf_counter()
    sample = hf_sampler(model, tokenizer, temperature=temperature, seed=seed)
    scores, calls, right_lookups, malformed, shown = [], 0, 0, 0, []
    for first in range(0, len(rows), batch_size):
        batch = rows[first : first + batch_size]
        environments = [SecretCodes() for _ in batch]
        for env, row in zip(environments, batch):
            env.reset(**row)
        boxes = [Toolbox(environment_tools(env)) for env in environments]
        prompt_ids = [templates.prompt_ids(tokenizer, r["prompt"], box.tools) for r, box in zip(batch, boxes)]
        trajectories, counts = run_turns(
            sample,
            tokenizer,
            prompt_ids,
            boxes,
            budget,
            max_iterations,
            getattr(model.config, "max_position_embeddings", None),
        )
        malformed += counts.malformed
        for t, env, row in zip(trajectories, environments, batch):
            scores.append(1.0 if code_is_right(t.messages, row["code"]) else 0.0)
            calls += bool(t.messages and t.messages[0].get("tool_calls"))
            right_lookups += env.lookups > 0
            if len(shown) < examples:
                shown.append(
                    {
                        "prompt": row["prompt"][-1]["content"],
                        "code": row["code"],
                        "messages": t.messages,
                        "reward": scores[-1],
                    }
                )
    n = len(scores)
    return {
        "temperature": temperature,
        "answers": n,
        "score": round(sum(scores) / n, 4),
        "parseable_calls": round(calls / n, 4),
        "right_lookups": round(right_lookups / n, 4),
        "malformed_calls": malformed,
        "seconds": round(time.perf_counter() - start, 1),
        "examples": shown,
    }
