"""An update's metrics under TRL's names: per-rollout objectives, the learner's averaged stats, and the rollout
engine's gap to the trainer where the engine reported its log-probs; averaged over processes (extremes taken
over them). The critic's health (``critic_health``: explained variance, pooled and per batch, the returns' variance,
the first value's correlation with the return) is each process's own, averaged."""

from __future__ import annotations

import torch

from trl_ext.ppo.critic_health import CriticHealth
from trl_ext.ppo.experience import Experience
from trl_ext.rollouts.record import RolloutBatch


def update_metrics(
    exp: Experience,
    learner_stats: dict[str, torch.Tensor],
    accelerator,
    kl_known: bool,
    critic_health: CriticHealth | None = None,
) -> dict:
    """``kl_known``: a reference ran (a KL term is on); otherwise the KL to it is not known and not reported.
    ``critic_health``: the run's window of the critic's fits (a fresh one if not given)."""
    outcome = exp.outcome
    local = {
        "objective/kl": outcome.kl.sum(1).mean(),
        "objective/entropy": (-exp.old_logprobs * exp.mask).sum(1).mean(),
        "objective/non_score_reward": outcome.non_score_rewards.sum(1).mean(),
        "objective/scores": outcome.scores.mean(),
        "val/response_length": exp.mask.sum(1).float().mean(),
        **learner_stats,
    }
    if outcome.returns is not None and outcome.values is not None:  # the critic's fit before this update
        health = critic_health if critic_health is not None else CriticHealth()
        local.update(health.observe(outcome.values, outcome.returns, outcome.value_mask))
    if not kl_known:
        del local["objective/kl"]
    names = list(local)
    gathered = accelerator.gather_for_metrics(torch.stack([local[n].float() for n in names])[None])
    metrics = dict(zip(names, gathered.mean(0).tolist()))
    metrics["objective/rlhf_reward"] = metrics["objective/scores"] + metrics["objective/non_score_reward"]
    if exp.sampling_logprobs is not None:
        metrics.update(sampling_metrics(exp, accelerator))
    return metrics


def rollout_metrics(batch: RolloutBatch, accelerator) -> dict:
    """The rollout's counters summed over every process, as its metrics."""
    if not batch.counters:
        return {}
    names = sorted(batch.counters)
    local = torch.tensor([float(batch.counters[n]) for n in names], dtype=torch.float64, device=accelerator.device)
    if accelerator.num_processes > 1:
        local = accelerator.reduce(local, reduction="sum")
    return batch.rollout_metrics(dict(zip(names, local.tolist())))


def sampling_metrics(exp: Experience, accelerator) -> dict:
    """How far the rollout engine's log-probs of its samples are from the trainer's (TRL GRPO's names), and the
    importance weights that correct for it."""
    mask = exp.mask.bool()
    gap = (exp.old_logprobs - exp.sampling_logprobs).abs()[mask]
    stats = {
        "sampling/sampling_logp_difference/mean": (gap.mean(), "mean"),
        "sampling/sampling_logp_difference/max": (gap.max(), "max"),
    }
    if exp.importance_weights is not None:
        weights = exp.importance_weights
        weights = weights.flatten() if weights.shape[1] == 1 else weights[mask]
        stats.update(
            {
                "sampling/importance_sampling_ratio/min": (weights.min(), "min"),
                "sampling/importance_sampling_ratio/mean": (weights.mean(), "mean"),
                "sampling/importance_sampling_ratio/max": (weights.max(), "max"),
            }
        )
    names = list(stats)
    gathered = accelerator.gather(torch.stack([stats[n][0].float() for n in names])[None])
    reduce = {"mean": torch.mean, "max": torch.amax, "min": torch.amin}
    return {n: reduce[stats[n][1]](gathered[:, i]).item() for i, n in enumerate(names)}


def numeric_metrics(stats: dict) -> dict:
    """The numbers of one update's stats (our trainer's or a TRL trainer's logs). Text, such as the
    (prompt, completion) samples our trainer adds, is left out; so are booleans."""
    return {k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
