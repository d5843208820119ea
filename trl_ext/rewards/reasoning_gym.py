"""reasoning-gym's verifiers as a reward function, for the datasets of ``trl_ext.data.reasoning_gym``.

The answer is read as the row's ``answer_format`` asks for it: ``"tags"`` (reasoning-gym's own prompts, and a dataset
without the column) as its ``extract_answer`` reads it, the last ``<answer>...</answer>`` of the completion;
``"last-number"`` the completion's last number (none: ``None``, which every verifier scores 0). The score is the
task's ``score_answer(answer, entry)``, 1.0 for a right answer and the task's own partial credit otherwise
(``gsm_symbolic`` gives 0.01 for a wrong number). One object serves TRL's GRPO/RLOO ``reward_funcs``, trl-ext's
``PPOTrainer`` and, through ``trl_ext.trl_compat.reward_model``, TRL 1.12's PPOTrainer: it reads the dataset's
``task``, ``task_config``, ``entry`` and ``answer_format`` columns, as they pass every other column on.
"""

from __future__ import annotations

from collections.abc import Mapping

from trl_ext.data.reasoning_gym import (
    ANSWER_FORMATS,
    DEFAULT_SYSTEM_PROMPT,
    import_reasoning_gym,
    last_number,
    loads_exact,
    reasoning_gym_dataset,
)
from trl_ext.rewards.base import RewardError, RewardFunction, require_column
from trl_ext.rewards.messages import message_text

COLUMNS = ("task", "task_config", "entry")


class ReasoningGymReward(RewardFunction):
    """``score_answer(extract_answer(completion), entry)`` of the task that generated each row."""

    name = "reasoning_gym"

    def __init__(self):
        import_reasoning_gym()  # a missing package is said here, not at the first batch
        self._scorers = {}  # (task, task_config) -> its generator, rebuilt once: score_answer may read its config

    def __getstate__(self):  # picklable for launched processes: the generators are rebuilt where it runs
        return {**self.__dict__, "_scorers": {}}

    def score(self, prompts: list, completions: list, **columns) -> list[float]:
        tasks, configs, entries = (require_column(self.__name__, columns, c) for c in COLUMNS)
        formats = columns.get("answer_format") or ["tags"] * len(completions)
        return [self._score(*row) for row in zip(completions, tasks, configs, entries, formats)]

    def _score(self, completion, task: str, task_config: str, entry: str, answer_format: str) -> float:
        scorer, entry = self._scorer(task, task_config), self._decoded(entry, "entry", task)
        answer = self._answer(message_text(completion), answer_format)
        try:
            return float(scorer.score_answer(answer, entry))
        except Exception:  # some verifiers raise on malformed answers (prime_factorization on 'abc'): a wrong answer
            return 0.0

    def _answer(self, text: str, answer_format: str) -> str | None:
        from reasoning_gym.utils import extract_answer

        if answer_format == "tags":
            return extract_answer(text)
        if answer_format == "last-number":
            return last_number(text)
        raise RewardError(
            f"reward {self.__name__!r}: a row's answer_format is {answer_format!r}; expected one of "
            f"{', '.join(ANSWER_FORMATS)}"
        )

    def _scorer(self, task: str, task_config: str):
        key = (task, task_config)
        if key not in self._scorers:
            import reasoning_gym

            settings = self._decoded(task_config, "task_config", task)
            try:
                self._scorers[key] = reasoning_gym.create_dataset(task, **settings)
            except (TypeError, ValueError, AssertionError) as err:
                raise RewardError(
                    f"reward {self.__name__!r}: cannot rebuild task {task!r} from its task_config "
                    f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
                ) from None
        return self._scorers[key]

    def _decoded(self, text: str, column: str, task: str):
        try:
            return loads_exact(text)
        except (TypeError, ValueError, KeyError) as err:  # not what trl_ext.data.reasoning_gym wrote
            raise RewardError(
                f"reward {self.__name__!r}: the {column!r} of a {task!r} row is not the JSON "
                f"reasoning_gym_dataset writes ({type(err).__name__})"
            ) from None


def reasoning_gym_task(
    spec: str,
    size: int = 1000,
    seed: int = 0,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    task_configs: Mapping[str, Mapping] | None = None,
    answer_format: str = "tags",
):
    """``(train_dataset, reward_func)`` for a reasoning-gym task or mix (``"chain_sum,basic_arithmetic"``, the
    ``reasoning-gym:`` prefix optional): what ``GRPOTrainer`` or trl-ext's ``PPOTrainer`` takes. The held-out
    stream of the same seed: ``reasoning_gym_dataset(spec, size, seed, split="test")``; at easy settings the two
    share questions, and ``trl_ext.data.reasoning_gym_splits.train_excluding`` makes a train stream without them."""
    dataset = reasoning_gym_dataset(
        spec,
        size,
        seed=seed,
        split="train",
        system_prompt=system_prompt,
        task_configs=task_configs,
        answer_format=answer_format,
    )
    return dataset, ReasoningGymReward()
