"""Rewards as a command names them: a model directory, a ``module:callable`` function, a reward server's address.
Several are summed (``WeightedSum``, GRPO's rule for None). The commands and the reward server's command load
through here; what a many-label classifier scores is the task's to say (``labelled``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trl_ext.rewards.base import import_reward_function
from trl_ext.rewards.classifier import ClassifierReward
from trl_ext.rewards.combine import WeightedSum


def load_reward_dir(
    path: str,
    *,
    dtype: str = "auto",
    labels=1,
    why: str | None = None,
    pair: bool = False,
    max_length: int = 512,
    labelled: Callable | None = None,
):
    """The reward a model directory gives: a scalar reward model (num_labels=1) scores as it is; a classifier of more
    labels through ``labelled(model, tokenizer)``, which picks the class whose logit is the reward. ``labels`` and
    ``why``: the label counts the folder check accepts, and what it says of any other."""
    from trl_ext.models.loading import load_sequence_classifier

    model, tokenizer = load_sequence_classifier(path, "reward model", dtype, labels=labels, why=why)
    if model.config.num_labels == 1:
        return ClassifierReward(model, tokenizer, pair=pair, max_length=max_length, name="reward_model")
    return labelled(model, tokenizer)


def connect_reward(url: str):
    """A ``RemoteReward`` whose server answered its health check (one line if not)."""
    from trl_ext.rewards.remote import RemoteReward

    reward = RemoteReward(url)
    reward.check()
    return reward


def summed(rewards: Sequence, weights: Sequence[float] | None = None):
    """One reward: the only one, or the weighted sum of several (GRPO's rule for None)."""
    if weights is None and len(rewards) == 1:
        return rewards[0]
    return WeightedSum(list(rewards), weights)


def reward_of(
    reward_dir: str | None, reward_fn: str | None, reward_url: str | None, load_dir: Callable[[str], Callable]
):
    """The reward a run trains on: the directory (loaded by ``load_dir``), the user's function and the server, in
    that order; several are summed."""
    # The server first: an unreachable one fails before any model loads.
    remote = connect_reward(reward_url) if reward_url else None
    rewards = [load_dir(reward_dir)] if reward_dir else []
    if reward_fn:
        rewards.append(import_reward_function(reward_fn))
    if remote is not None:
        rewards.append(remote)
    return summed(rewards)
