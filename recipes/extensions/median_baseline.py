"""An advantage estimator without a critic: each completion's return against the median return of its prompt's
completions (a baseline that one outlier in the group does not move).

    trl-ext ppo ... --advantage-estimator recipes/extensions/median_baseline.py:median_baseline --num-generations 4
"""

import torch

from trl_ext.ppo.advantages import ADVANTAGE_ESTIMATORS


@ADVANTAGE_ESTIMATORS.register("median_baseline")  # needs_values=False (the default): no critic is built
def median_baseline(batch, config):
    """``EstimatorInputs`` in; advantages ``(B, T)`` and no value targets out."""
    returns = batch.sequence_returns()  # (B,): score minus the KL penalty
    medians = torch.stack([returns[batch.group_ids == g].median() for g in batch.group_ids])
    return batch.per_token(returns - medians), None
