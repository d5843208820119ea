"""What the equality tests with TRL's GRPO/RLOO do to TRL's trainer before it runs: a reference apart from the
policy (so the KL term and its gradient are not zero), a copy of it for our side, and TRL's logs kept."""

import copy

import torch


def prepare_trl_trainer(trainer, recorded: dict) -> None:
    """Perturb ``trainer``'s reference (when it has one: beta > 0), copy it into ``recorded["ref_model"]`` and
    append every log TRL writes to ``recorded["logs"]``."""
    from transformers import TrainerCallback

    if trainer.ref_model is not None:
        with torch.no_grad():
            generator = torch.Generator().manual_seed(5)
            for p in trainer.ref_model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
    recorded["ref_model"] = copy.deepcopy(trainer.ref_model)

    class RecordLogs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            recorded.setdefault("logs", []).append(dict(logs or {}))

    trainer.add_callback(RecordLogs())
