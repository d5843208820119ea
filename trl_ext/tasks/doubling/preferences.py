"""Preference pairs for the doubling task (a Bradley-Terry reward model's data, on our task).

Every pair is a prefixed prompt, the exact answer as ``chosen``, and one of these as ``rejected``,
drawn with a seeded ``random.Random`` in fixed proportions:

* 60% a wrong value in the requested set: a digit changed, two swapped, one inserted or dropped;
* 15% the right value in another character set (what the charset classifier already sees);
* 15% the right value with some of its characters (one to all but one) in another set;
*  5% the exact answer without its closing ``E``;
*  5% the answer cut short (one to all-but-one of its characters), ``E`` kept.

Wrong values get most of the pairs because they are the hard kind: a reward model trained on 30% of
them judged 91-96% of held-out wrong-value pairs right at 1,200 steps; every other kind was at 100%.

Unlike the charset classifier, a reward model trained on these sees wrong values too. The mixed
answers are there because PPO found them: a reward model trained without them scored answers such
as ``1332贰E`` highest, and the policy learned to write them.
"""

from __future__ import annotations

import random

from datasets import Dataset

from trl_ext.errors import InputError
from trl_ext.tasks.doubling.task import CHARSETS, EOS, generate_samples, spell

KINDS = (
    ("wrong_value", 0.60),
    ("other_charset", 0.15),
    ("mixed_charset", 0.15),
    ("missing_eos", 0.05),
    ("truncated", 0.05),
)


def _wrong_value(value: int, rng: random.Random) -> int:
    """One digit changed (40%), two adjacent digits swapped, a digit inserted, or one dropped (20% each).

    Inserted and dropped digits are there because PPO found their absence: a reward model trained
    on same-length mistakes only scored ``3321x2=16642E`` above ``6642E`` and the policy learned it.
    """
    digits = list(str(value))
    while True:
        changed, mode = list(digits), rng.choices(("change", "swap", "insert", "drop"), (0.4, 0.2, 0.2, 0.2))[0]
        if mode == "swap" and len(changed) > 1:
            i = rng.randrange(len(changed) - 1)
            changed[i], changed[i + 1] = changed[i + 1], changed[i]
        elif mode == "insert":
            changed.insert(rng.randrange(len(changed) + 1), str(rng.randrange(10)))
        elif mode == "drop" and len(changed) > 1:
            del changed[rng.randrange(len(changed))]
        else:
            i = rng.randrange(len(changed))
            changed[i] = str((int(changed[i]) + rng.randrange(1, 10)) % 10)
        if changed[0] != "0" and changed != digits:
            return int("".join(changed))


def rejected_answer(question: int, label: int, kind: str, rng: random.Random) -> str:
    value = 2 * question
    if kind == "other_charset":
        return spell(value, rng.choice([c for c in range(len(CHARSETS)) if c != label])) + EOS
    if kind == "wrong_value":
        return spell(_wrong_value(value, rng), label) + EOS
    if kind == "mixed_charset":
        right, other = spell(value, label), spell(value, rng.choice([c for c in range(len(CHARSETS)) if c != label]))
        if len(right) == 1:  # one character cannot mix: write it in the other set
            return other + EOS
        swapped = set(rng.sample(range(len(right)), rng.randrange(1, len(right))))
        return "".join(o if i in swapped else r for i, (r, o) in enumerate(zip(right, other))) + EOS
    if kind == "missing_eos":
        return spell(value, label)
    if kind == "truncated":
        answer = spell(value, label)
        return answer[: rng.randrange(1, len(answer))] + EOS
    raise InputError(f"unknown rejection kind {kind!r}")


def preference_dataset(n: int, seed: int, split: str = "train") -> Dataset:
    """``prompt``/``chosen``/``rejected`` (TRL's explicit-prompt preference format) plus ``kind``."""
    rng = random.Random(seed + 7919)
    kinds, weights = zip(*KINDS)
    rows = {"prompt": [], "chosen": [], "rejected": [], "kind": []}
    for sample in generate_samples(n, seed, split, prefixed=True):
        kind = rng.choices(kinds, weights)[0]
        rows["prompt"].append(sample.prompt)
        rows["chosen"].append(sample.answer)
        rows["rejected"].append(rejected_answer(sample.question, sample.label, kind, rng))
        rows["kind"].append(kind)
    return Dataset.from_dict(rows)
