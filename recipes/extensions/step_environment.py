"""A rollout of your own: an environment with ``reset()`` and ``step(text) -> (observation, reward, done)`` (the
gym shape), whose observations come back to the policy as user turns. Guess the number: each wrong guess is told
"higher" or "lower"; a right one ends the episode with reward 1.

    PPOConfig(rollout="recipes/extensions/step_environment.py:guess_the_number", ...)   # or --rollout on the CLI

A rollout is one method, ``rollout(rows, sampling) -> RolloutBatch``; it holds no trainer, and declares the reward
functions it brings (here the episode's return, read from a column it hands to scoring) when it is built.
"""

import re

from trl_ext.agents.templates import prompt_ids, turn_suffix_ids
from trl_ext.agents.trajectory import Trajectory
from trl_ext.rollouts import ROLLOUTS, Rollout
from trl_ext.rollouts.tool_loop import conversations, turn_sampler
from trl_ext.rollouts.trajectories import trajectories_record


class GuessTheNumber:
    """The environment: one secret digit per episode, from the dataset row's ``secret`` column."""

    def reset(self, secret: int, **row) -> str:
        self.secret = int(secret)
        return "Guess my digit (0-9)."

    def step(self, text: str) -> tuple[str, float, bool]:
        guess = re.search(r"\d", text)
        if guess is None:
            return "Answer with one digit.", 0.0, False
        if int(guess.group()) == self.secret:
            return "Right!", 1.0, True
        return ("Higher." if int(guess.group()) < self.secret else "Lower."), 0.0, False


def episode_return(episode_return, **_):
    """The reward function this rollout brings: the column it hands to scoring."""
    return episode_return


class StepEnvironmentRollout(Rollout):
    def __init__(self, make_environment=GuessTheNumber, max_turns: int = 3):
        self.make_environment, self.max_turns = make_environment, max_turns
        self.reward_funcs = [episode_return]

    def check(self, config, tokenizer) -> None:
        turn_suffix_ids(tokenizer, [{"role": "user", "content": "probe"}])  # raises where a turn is not a suffix

    def rollout(self, rows, sampling):
        tokenizer, budget = sampling.tokenizer, sampling.config.response_length
        prompts = conversations(rows["prompt"])
        columns = [k for k in rows if k not in ("input_ids", "attention_mask", "prompt")]
        environments = [self.make_environment() for _ in prompts]
        for i, (env, prompt) in enumerate(zip(environments, prompts)):  # the first observation ends the prompt
            first = env.reset(**{k: rows[k][i] for k in columns})
            prompts[i] = prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + " " + first}]
        trajectories = [Trajectory(prompt_ids(tokenizer, p, [])) for p in prompts]
        returns, active, sample = [0.0] * len(prompts), list(range(len(prompts))), turn_sampler(sampling)
        for _ in range(self.max_turns):
            active = [i for i in active if len(trajectories[i].ids) < budget]
            if not active:
                break
            room = [budget - len(trajectories[i].ids) for i in active]
            new_ids, new_logprobs = sample(
                [trajectories[i].prompt_ids + trajectories[i].ids for i in active], max(room)
            )
            going = []
            for k, i in enumerate(active):
                t, ids = trajectories[i], new_ids[k][: room[k]]
                t.add_model_turn(ids, None if new_logprobs is None else new_logprobs[k][: len(ids)])
                text = tokenizer.decode(ids, skip_special_tokens=True)
                t.messages.append({"role": "assistant", "content": text})
                observation, reward, done = environments[i].step(text)
                returns[i] += reward
                message = [{"role": "user", "content": observation}]
                suffix = turn_suffix_ids(tokenizer, message)
                if done or len(t.ids) + len(suffix) > budget:
                    continue
                t.add_environment_turn(suffix, message)
                going.append(i)
            active = going
        return trajectories_record(
            trajectories, prompts, tokenizer.pad_token_id, sampling.device, columns={"episode_return": returns}
        )


ROLLOUTS.register("guess_the_number")(StepEnvironmentRollout)
guess_the_number = StepEnvironmentRollout  # the name `module:name` reaches
