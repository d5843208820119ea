"""Launched with 2 processes (torchrun) by tests/test_sharded.py and tests/test_static_sampler.py: the scratch
rollout and update (two_ranks.py) on a tiny GPT-2 really sharded with PyTorch's FSDP2 over gloo (accelerate
turns FSDP on only with GPUs, so this subclass shards in the trainer's one wrapping hook)."""

import sys

import two_ranks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from trl_ext.ppo import PPOTrainer


class FSDP2Trainer(PPOTrainer):
    def _shards_parameters(self):
        return True

    def _prepare(self, model):
        mesh = init_device_mesh("cpu", (self.accelerator.num_processes,))
        for block in model.policy.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, self._optimizer(model)


def main() -> int:
    trainer = two_ranks.build_trainer(FSDP2Trainer)
    model = trainer.model
    params = list(model.parameters())
    two_ranks.train_and_report(
        trainer,
        params,
        whole=lambda: [p.full_tensor().clone() for p in model.parameters()],
        local=sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params),
        total=sum(p.numel() for p in params),
        # resharded after every rollout
        after=lambda: {"sharded_after": all(isinstance(p, DTensor) for p in model.parameters())},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
