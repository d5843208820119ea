"""Task metrics for the doubling task: is the value right, is the requested set used, exact match."""

from __future__ import annotations

import torch

from trl_ext.data.batching import pad_batch
from trl_ext.errors import InputError
from trl_ext.tasks.doubling.generation import generate_completions
from trl_ext.tasks.doubling.task import CHARSET_NAMES, eval_prompt_dataset, parse_answer, truncate_completion


def score_completions(questions: list[int], labels: list[int], answers: list[str], completions: list[str]) -> dict:
    """``value_acc``, ``charset_acc``, ``exact`` and ``finished`` rates overall and per label.

    ``exact`` is the seed's test: the completion up to its first E equals the expected answer.
    """
    if not (len(questions) == len(labels) == len(answers) == len(completions)) or not completions:
        raise InputError(
            f"need equally many questions, labels, answers and completions (got {len(questions)}, "
            f"{len(labels)}, {len(answers)}, {len(completions)}), and at least one"
        )
    rows = []
    for question, label, answer, completion in zip(questions, labels, answers, completions):
        parsed = parse_answer(completion)
        rows.append(
            {
                "label": label,
                "value": parsed.value == 2 * question,
                "charset": parsed.charset == label,
                "exact": truncate_completion(completion) == answer,
                "finished": parsed.finished,
                "charset_used": parsed.charset,
            }
        )

    def rates(subset: list[dict]) -> dict:
        n = len(subset)
        return {
            "n": n,
            "value_acc": sum(r["value"] for r in subset) / n if n else float("nan"),
            "charset_acc": sum(r["charset"] for r in subset) / n if n else float("nan"),
            "exact": sum(r["exact"] for r in subset) / n if n else float("nan"),
            "finished": sum(r["finished"] for r in subset) / n if n else float("nan"),
        }

    result = rates(rows)
    result["per_label"] = {name: rates([r for r in rows if r["label"] == i]) for i, name in enumerate(CHARSET_NAMES)}
    used = [r["charset_used"] for r in rows]
    result["charset_spread"] = {name: used.count(i) / len(rows) for i, name in enumerate(CHARSET_NAMES)}
    result["charset_spread"]["mixed_or_none"] = used.count(None) / len(rows)
    return result


def evaluate_policy(
    model,
    tokenizer,
    n: int = 1000,
    seed: int = 0,
    sample: bool = True,
    prompt_prefixed: bool = True,
    max_new_tokens: int = 8,
) -> dict:
    """Greedy (and, with ``sample``, temperature-1 sampled) metrics on ``n`` held-out prompts.

    ``prompt_prefixed=False`` asks with ``__`` instead (how the pretrained policy was trained):
    the charset spread then shows which set the policy picks on its own.
    """
    data = eval_prompt_dataset(tokenizer, n, seed)
    prompts, prompt_ids = data["prompt"], data["input_ids"]
    if not prompt_prefixed:
        prompts = ["S__" + p[3:] for p in prompts]
        prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    report = {"n": n, "prompt_prefixed": prompt_prefixed}
    modes = {"greedy": False, "sampled": True} if sample else {"greedy": False}
    for mode, do_sample in modes.items():
        completions = generate_completions(
            model, tokenizer, prompt_ids, do_sample=do_sample, seed=seed, max_new_tokens=max_new_tokens
        )
        report[mode] = score_completions(data["question"], data["label"], data["answer"], completions)
        report[mode]["examples"] = [p + c for p, c in zip(prompts[:5], completions[:5])]
    return report


@torch.no_grad()
def classifier_accuracy(model, tokenizer, dataset, batch_size: int = 500) -> float:
    """Share of rows whose argmax class equals the ``label`` column."""
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        ids, mask = pad_batch(rows["input_ids"], tokenizer.pad_token_id, side="right")
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        correct += (logits.argmax(-1).cpu() == torch.as_tensor(rows["label"])).sum().item()
    return correct / len(dataset)


def greedy_probe(policy, tokenizer, n: int = 200, seed: int = 1) -> dict:
    """A run's held-out check while it trains: greedy exact-match and requested-charset rate on ``n`` prompts."""
    greedy = evaluate_policy(policy, tokenizer, n=n, seed=seed, sample=False)["greedy"]
    return {"exact": greedy["exact"], "charset_acc": greedy["charset_acc"]}
