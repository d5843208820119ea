"""``trl-ext rlhf --task-eval-size N``: the policy's greedy score on the first N prompts of ``--task``'s test stream,
before training (the policy as loaded, no adapter yet) and after (the trained policy, its adapter on), written to
``task_eval.json``.

The answers are scored as training scores them: the task's verifier (``ReasoningGymReward``) called as the trainer
calls a reward, each completion handed as one assistant message. The test stream of the run's seed shares no
generator seed with the train stream the run learns from (``trl_ext.data.reasoning_gym``), and the train stream asks
none of the test prompts' questions (``trl_ext.data.reasoning_gym_splits``): ``task_eval.json`` records the overlap
(``test_overlap``, 0) and how many distinct questions the setting makes (``distinct_questions``, estimated).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXAMPLES = 2  # answers kept in task_eval.json per evaluation: enough to see what the model writes
PHASES = ("before", "after")


@dataclass
class TaskEval:
    """One run's held-out evaluation: its prompts, how answers are generated, and the scores so far."""

    task: str
    seed: int
    max_new_tokens: int
    rows: Any  # datasets.Dataset: the test stream's first rows, with the columns the verifier reads
    max_prompt_length: int | None = None  # the run's: prompts are cut on the left as training cuts them
    scores: dict[str, float] = field(default_factory=dict)  # phase -> mean score
    examples: list[dict] = field(default_factory=list)
    test_overlap: int | None = None  # test prompts whose question the train prompts ask (``check_train``): 0
    distinct_questions: int | None = None  # the setting's distinct questions, estimated (``check_train``)

    @classmethod
    def of_task(
        cls, task: str, size: int, seed: int, max_new_tokens: int, max_prompt_length: int | None = None, **settings
    ) -> TaskEval:
        """``settings``: ``reasoning_gym_dataset``'s ``task_configs`` and ``answer_format``, as the run trains."""
        return cls(task, seed, max_new_tokens, held_out_rows(task, size, seed, **settings), max_prompt_length)

    def check_train(self, train, task_configs=None) -> None:
        """Records how many test prompts ask a question the train prompts ``train`` (a prompt dataset) ask, and the
        setting's estimated distinct questions (``trl_ext.data.reasoning_gym_splits``)."""
        from trl_ext.data.reasoning_gym_splits import distinct_questions, question_overlap

        self.test_overlap = question_overlap(train, self.rows)
        self.distinct_questions = distinct_questions(self.task, task_configs).estimate

    def score(self, phase: str, model, tokenizer) -> float:
        """The mean greedy score of ``model`` on the prompts, kept as ``phase`` ('before' or 'after')."""
        from trl_ext.models.chat_completions import generate
        from trl_ext.rewards.base import call_reward
        from trl_ext.rewards.reasoning_gym import ReasoningGymReward
        from trl_ext.rewards.scoring import as_completions

        prompts = self.rows["prompt"]
        # Greedy answers are the same every time only without dropout (LoRA's, once training has begun).
        was_training = model.training
        model.eval()
        try:
            answers = generate(
                model,
                tokenizer,
                prompts,
                temperature=0.0,
                max_new_tokens=self.max_new_tokens,
                max_prompt_length=self.max_prompt_length,
            )
        finally:
            model.train(was_training)
        columns = {name: self.rows[name] for name in self.rows.column_names if name != "prompt"}
        values = call_reward(ReasoningGymReward(), prompts, as_completions(prompts, answers), **columns)
        self.scores[phase] = round(sum(values) / len(values), 4)
        self.examples += [
            {"phase": phase, "question": prompt[-1]["content"], "answer": answer, "score": value}
            for prompt, answer, value in list(zip(prompts, answers, values))[:EXAMPLES]
        ]
        return self.scores[phase]

    def line(self, phase: str) -> str:
        return (
            f"[task-eval] {phase} training: greedy score {self.scores[phase]} on the first {len(self.rows)} "
            f"prompts of {self.task}'s test stream"
        )

    def write(self, out: Path) -> None:
        record = {
            "task": self.task,
            "split": "test",
            "seed": self.seed,
            "prompts": len(self.rows),
            "max_new_tokens": self.max_new_tokens,
            "max_prompt_length": self.max_prompt_length,
            "test_overlap": self.test_overlap,
            "distinct_questions": self.distinct_questions,
            **{phase: self.scores.get(phase) for phase in PHASES},
            "examples": self.examples,
        }
        (out / "task_eval.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def held_out_rows(task: str, size: int, seed: int, **settings):
    """The first ``size`` prompts of ``task``'s test stream of ``seed``: what ``TaskEval`` scores, and what the run's
    train stream leaves out (``trl_ext.runs.rlhf.task_prompts``)."""
    from trl_ext.data.reasoning_gym import reasoning_gym_dataset

    return reasoning_gym_dataset(task, size, seed=seed, split="test", **settings)
