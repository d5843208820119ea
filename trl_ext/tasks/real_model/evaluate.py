"""Held-out scores of a chat model on the real-model task: greedy and sampled answers, graded by the reward.

Prompts go through the tokenizer's chat template with ``add_generation_prompt=True`` (as TRL's trainers
render conversations); completions are decoded without special tokens and handed to the reward as one
assistant message, as the scratch trainer and TRL's GRPO hand them.
"""

from __future__ import annotations

import time
from collections import Counter

from trl_ext.models.chat_completions import generate
from trl_ext.tasks.real_model.task import JustTheNumber


def score_rows(
    model,
    tokenizer,
    rows: list[dict],
    *,
    temperature: float = 0.0,
    samples: int = 1,
    reward: JustTheNumber | None = None,
    examples: int = 5,
    **generate_kwargs,
) -> dict:
    """Mean reward over ``rows`` x ``samples`` answers, the share of each grade, the share scoring above 0,
    the mean per example turn, and a few answers as examples."""
    reward = reward or JustTheNumber()
    prompts = [row["prompt"] for row in rows]
    seed = generate_kwargs.pop("seed", 0)
    start = time.perf_counter()
    texts, grades, scores = [], [], []
    for k in range(samples):
        batch = generate(model, tokenizer, prompts, temperature=temperature, seed=seed + k, **generate_kwargs)
        completions = [[{"role": "assistant", "content": t}] for t in batch]
        scores += reward(prompts, completions, answer=[r["answer"] for r in rows])
        grades += [reward.grade(t, r["answer"]) for t, r in zip(batch, rows)]
        texts += batch
    n = len(scores)
    # Per example turn (the first message): the held-out set asks every number after each of them.
    per_example = {}
    for example in dict.fromkeys(r["prompt"][0]["content"] for r in rows):
        picked = [s for i, s in enumerate(scores) if rows[i % len(rows)]["prompt"][0]["content"] == example]
        per_example[example] = round(sum(picked) / len(picked), 4)
    counts = Counter(grades)
    return {
        "temperature": temperature,
        "samples_per_prompt": samples,
        "answers": n,
        "score": round(sum(scores) / n, 4),
        "grades": {g: round(counts[g] / n, 4) for g in JustTheNumber.GRADES},
        "scoring_above_zero": round(sum(s > 0 for s in scores) / n, 4),
        "per_example_turn": per_example,
        "seconds": round(time.perf_counter() - start, 1),
        "examples": [
            {"prompt": rows[i % len(rows)]["prompt"][-1]["content"], "completion": texts[i], "reward": scores[i]}
            for i in range(min(examples, n))
        ],
    }
