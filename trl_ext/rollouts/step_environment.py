"""``step()`` environments as a rollout (``PPOConfig(rollout=...)``/``PPOTrainer(rollout=StepEnvironment(Factory))``,
``rlhf --environment gem:NAME``): an environment with Gym's ``reset``/``step`` (``trl_ext.agents.steps``) plays the
conversation's other side. Each row's environment is reset with the row's columns (a ``seed`` picks the game), its
first observation ends the prompt as a user turn; each model turn is the action and each observation the next user
turn, in the tool loop's own turn loop (``agents.turns.run_turns``), with a token cap a turn and a turn cap an
episode.

Rewards (``rewards``): ``"turn"``, each step's reward on its turn's last token, where GAE credits it (the last
turn's is the score: it lands on the same token); ``"final"``, the episode's return as the score alone. Either way a
sequence estimator (GRPO, RLOO, REINFORCE++) trains on the episode's return. The score reaches scoring as the
column ``environment_reward``, read by the reward function this rollout brings (weight 1).
"""

from __future__ import annotations

from collections.abc import Callable

from trl_ext.agents import templates
from trl_ext.agents.steps import REWARD_MODES, StepSide, reset_observation
from trl_ext.agents.turns import run_turns
from trl_ext.errors import InputError
from trl_ext.rollouts.base import ROLLOUTS, Rollout, Sampling
from trl_ext.rollouts.record import RolloutBatch
from trl_ext.rollouts.tool_loop import NOT_RESET_ARGUMENTS, check_multi_turn, conversations, turn_sampler
from trl_ext.rollouts.trajectories import trajectories_record

# metric -> (counter, its divisor; None: the count itself), beside the turn metrics every multi-turn record has
EPISODE_RATES: dict[str, tuple[str, str | None]] = {
    "env/return": ("episode_return", "rollouts"),
    "env/terminated": ("terminated", "rollouts"),
    "env/truncated": ("truncated", "rollouts"),
    "env/dropped_observations": ("dropped", None),
}


def environment_reward(environment_reward, **_):
    """The score of a step-environment rollout: its last turn's reward (``rewards="turn"``) or its return."""
    return environment_reward


def with_observation(prompt: list[dict], observation: str) -> list[dict]:
    """The prompt with the first observation as its user turn: appended to a last user message, else a new one."""
    if not observation:
        return list(prompt)
    if prompt and prompt[-1].get("role") == "user":
        content = prompt[-1]["content"]
        joined = content + ("\n\n" if content and not content[-1].isspace() else "") + observation
        return prompt[:-1] + [{**prompt[-1], "content": joined}]
    return list(prompt) + [{"role": "user", "content": observation}]


@ROLLOUTS.register("step_environment")
class StepEnvironment(Rollout):
    """``environment_factory()`` makes one environment a rollout (made once, reset for each batch);
    ``max_turns``: steps an episode (None: the environment's own limit); ``max_turn_tokens``: tokens a turn (None:
    what is left of ``response_length``, the one budget of all the turns and observations)."""

    def __init__(
        self,
        environment_factory: Callable | None = None,
        max_turns: int | None = None,
        max_turn_tokens: int | None = None,
        rewards: str = "turn",
    ):
        if environment_factory is None:
            raise InputError(
                "the step_environment rollout plays an environment: give it one, "
                "PPOTrainer(rollout=StepEnvironment(Factory)), or rlhf --environment gem:NAME / textarena:NAME"
            )
        if not callable(environment_factory):
            raise InputError(f"environment_factory must make an environment, got {environment_factory!r:.80}")
        for name, value in (("max_turns", max_turns), ("max_turn_tokens", max_turn_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InputError(f"{name} must be a positive integer or None, got {value!r}")
        if rewards not in REWARD_MODES:
            raise InputError(f"rewards must be one of {', '.join(REWARD_MODES)}; got {rewards!r}")
        self.factory, self.max_turns, self.max_turn_tokens, self.rewards = (
            environment_factory,
            max_turns,
            max_turn_tokens,
            rewards,
        )
        self.environments: list = []
        self.reward_funcs = [environment_reward]

    def check(self, config, tokenizer) -> None:
        check_multi_turn(config)
        if config.max_tool_calling_iterations is not None:
            raise InputError(
                "max_tool_calling_iterations bounds tool calls; a step environment's episodes are bounded by "
                "its max_turns (rlhf --environment-turns): drop it"
            )
        templates.turn_suffix_ids(tokenizer, [{"role": "user", "content": "probe"}])  # a user turn is a suffix

    def take(self, count: int) -> list:
        """``count`` environments, one a rollout (made as needed, reused across batches)."""
        while len(self.environments) < count:
            self.environments.append(self.factory())
        return self.environments[:count]

    def rollout(self, rows: dict, sampling: Sampling) -> RolloutBatch:
        tokenizer, config = sampling.tokenizer, sampling.config
        prompts = conversations(rows.get("prompt") or tokenizer.batch_decode(rows["input_ids"]))
        environments = self.take(len(prompts))
        keys = [k for k in rows if k not in (*NOT_RESET_ARGUMENTS, "prompt")]
        prompts = [
            with_observation(p, reset_observation(e, {k: rows[k][i] for k in keys}))
            for i, (p, e) in enumerate(zip(prompts, environments))
        ]
        sides = [StepSide(e, self.max_turns) for e in environments]
        trajectories, counts = run_turns(
            turn_sampler(sampling),
            tokenizer,
            [templates.prompt_ids(tokenizer, p, []) for p in prompts],
            sides,
            config.response_length,
            max_positions=sampling.max_positions,
            turn_tokens=self.max_turn_tokens,
        )
        scores = []
        for t, side in zip(trajectories, sides):
            if self.rewards == "final":
                t.turn_rewards = []
                scores.append(side.episode_return)
            else:  # the last turn's reward is the score, on the same token (the episode ends on a model turn)
                t.turn_rewards = [(p, r) for p, r in t.turn_rewards if p != len(t.ids) - 1]
                scores.append(side.rewards[-1] if side.rewards else 0.0)
        columns = {"environments": environments, "environment_reward": scores}
        record = trajectories_record(trajectories, prompts, tokenizer.pad_token_id, sampling.device, None, columns)
        record.counters.update(
            episode_return=sum(s.episode_return for s in sides),
            terminated=sum(s.terminated for s in sides),
            # cut short: its own limit (GEM's last turn is both), max_turns, or the budget (neither flag set)
            truncated=sum(s.truncated or not s.terminated for s in sides),
            dropped=counts.overlong,
        )
        record.rates.update(EPISODE_RATES)
        return record
