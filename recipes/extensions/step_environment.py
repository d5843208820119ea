"""An environment of your own with Gym's ``reset``/``step`` (text in, text out), played by the ``step_environment``
rollout (``trl_ext.rollouts.StepEnvironment``): its observations come back to the policy as user turns. Guess the
number: each wrong guess is told "higher" or "lower"; a right one ends the episode with reward 1.

    PPOConfig(rollout="recipes/extensions/step_environment.py:guess_the_number", ...)   # or --rollout on the CLI

GEM's and TextArena's games play the same way by name: ``rlhf --environment gem:game:GuessTheNumber-v0-easy``.
"""

import re

from trl_ext.rollouts import StepEnvironment


class GuessTheNumber:
    """One secret digit an episode, from the dataset row's ``secret`` column."""

    def reset(self, secret: int, **row) -> tuple[str, dict]:
        self.secret = int(secret)
        return "Guess my digit (0-9).", {}

    def step(self, text: str) -> tuple[str, float, bool, bool, dict]:
        guess = re.search(r"\d", text)
        if guess is None:
            return "Answer with one digit.", 0.0, False, False, {}
        if int(guess.group()) == self.secret:
            return "Right!", 1.0, True, False, {}
        return ("Higher." if int(guess.group()) < self.secret else "Lower."), 0.0, False, False, {}


def guess_the_number() -> StepEnvironment:
    """The name ``module:name`` reaches: three guesses an episode, the win's reward as the score."""
    return StepEnvironment(GuessTheNumber, max_turns=3)
