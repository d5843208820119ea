"""Rule rewards for the doubling task: ground truth for any trainer, and labels for the classifier reward."""

from __future__ import annotations

from trl_ext.errors import InputError
from trl_ext.rewards.base import RewardFunction
from trl_ext.tasks.doubling.task import NUM_LABELS, expected_answer, parse_answer, parse_prompt, truncate_completion


def requested_label(prompt: str) -> int:
    """The character set a prefixed prompt asks for (``S数字:...`` -> 0). A module-level function, so it pickles."""
    label = parse_prompt(prompt).label
    if label is None:
        raise InputError(f"prompt {prompt!r} has no charset prefix")
    return label


class _DoublingRule(RewardFunction):
    """1.0 where the rule holds, else 0.0. Uses the ``question``/``label`` columns when given,
    otherwise reads them from the prompt."""

    def _targets(self, prompts, columns):
        questions = columns.get("question") or [parse_prompt(p).question for p in prompts]
        labels = columns.get("label") or [requested_label(p) for p in prompts]
        return questions, labels

    def score(self, prompts, completions, **columns):
        questions, labels = self._targets(prompts, columns)
        return [float(self.holds(q, lab, c)) for q, lab, c in zip(questions, labels, completions)]


class ValueCorrect(_DoublingRule):
    """The answer's number is twice the question, in any character set(s)."""

    name = "doubling_value"

    def holds(self, question, label, completion):
        return parse_answer(completion).value == 2 * question


class CharsetCompliance(_DoublingRule):
    """The answer is written wholly in the character set the prefix asks for."""

    name = "doubling_charset"

    def holds(self, question, label, completion):
        return parse_answer(completion).charset == label


class ExactMatch(_DoublingRule):
    """The completion up to its first E is exactly the expected answer (the seed's test)."""

    name = "doubling_exact"

    def holds(self, question, label, completion):
        return truncate_completion(completion) == expected_answer(question, label)


def doubling_classifier_reward(model, tokenizer, label_column: str | None = None, label_score: str = "probability"):
    """The classifier's probability of the character set the prompt asks for (``label_score="logit"``: its
    logit). The logit rewarded each wrong set differently (-0.2 to -3.5 for one classifier):
    runs settled on the least-punished set for every prefix (docs/decisions.md, "Why a run settles").

    The requested set comes from the prompt's prefix, or from ``label_column`` when given.
    """
    from trl_ext.rewards.classifier import ClassifierReward

    label = {"label_column": label_column} if label_column is not None else {"label_fn": requested_label}
    return ClassifierReward(model, tokenizer, name="charset_classifier", label_score=label_score, **label)


# What a doubling reward directory may hold: the charset classifier, or a scalar reward model.
REWARD_DIR_LABELS = {
    "labels": (1, NUM_LABELS),
    "why": f"the doubling reward needs the {NUM_LABELS}-label charset "
    "classifier or a scalar reward model (num_labels=1)",
}


def load_doubling_reward(path: str):
    """The reward a doubling reward directory gives: a scalar reward model (num_labels=1, `train-reward-model`)
    scores as it is; the charset classifier gives the logit of the requested set."""
    from trl_ext.rewards.loading import load_reward_dir

    return load_reward_dir(path, labelled=doubling_classifier_reward, **REWARD_DIR_LABELS)
