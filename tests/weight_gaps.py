"""How two sets of weights that took the same Adam steps are compared."""

import torch

TOLERANCE = 1e-5


def assert_same_adam_steps(ours: dict, theirs: dict, tolerance: float = TOLERANCE) -> None:
    """Every element within ``tolerance`` but a few, and those within 5x. Adam scales each step by the element's own
    gradient, so where one step's gradient is near 0, rounding (another summation order, another CPU) can move that
    element by a sliver of the learning rate either way; a wrong loss, advantage or weighting moves thousands of
    elements by far more."""
    per_name = {name: (ours[name] - theirs[name]).abs().flatten() for name in ours}
    gaps = torch.cat(list(per_name.values()))
    outliers = int((gaps > tolerance).sum())
    worst = max(per_name, key=lambda name: per_name[name].max())
    assert gaps.max() < 5 * tolerance and outliers <= 8, (gaps.max().item(), outliers, worst)
