"""Launched with 2 processes (torchrun, DS_ACCELERATOR=cpu) by tests/test_sharded.py: the scratch trainer's rollout
and update (two_ranks.py) on a tiny GPT-2 partitioned by DeepSpeed ZeRO-3 over gloo. accelerate does not run
DeepSpeed on CPU (its state sees one process per rank), so this subclass drives DeepSpeed directly in the
trainer's wrapping hook, and steps through the engine as accelerate does on GPUs."""

import os
import sys

import deepspeed
import two_ranks

from trl_ext.ppo import PPOTrainer
from trl_ext.ppo.config import mini_batch_size


class ZeRO3Trainer(PPOTrainer):
    def _shards_parameters(self):
        return True

    def _prepare(self, model):
        config = {
            "train_micro_batch_size_per_gpu": mini_batch_size(self.config),
            "gradient_accumulation_steps": 1,
            # 0: partition every parameter of a tiny model (the default keeps those under 100k elements whole)
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "optimizer": {
                "type": "AdamW",
                "params": {"lr": self.config.learning_rate, "eps": 1e-8, "weight_decay": 0.0, "torch_adam": True},
            },
        }
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, config=config, model_parameters=[p for p in model.parameters() if p.requires_grad]
        )
        return engine, optimizer

    def _backward(self, loss):
        self.model.backward(loss)

    def _optimizer_step(self):
        self.model.step()


def main() -> int:
    deepspeed.init_distributed(dist_backend="gloo")
    trainer = two_ranks.build_trainer(ZeRO3Trainer)
    params = list(trainer.model.module.parameters())

    def whole():
        with deepspeed.zero.GatheredParameters(params):
            return [p.detach().clone() for p in params]

    two_ranks.train_and_report(
        trainer,
        params,
        whole,
        local=sum(p.ds_tensor.numel() for p in params),
        total=sum(p.ds_numel for p in params),
        partitioned=all(p.data.numel() == 0 for p in params),
    )  # outside a forward
    return 0


if __name__ == "__main__":
    code = main()
    # Skip interpreter teardown: DeepSpeed's CPU comm and gloo leave C++ threads behind, and destroying
    # them at exit aborted one rank now and then ("terminate called without an active exception") after
    # its results were printed.
    sys.stdout.flush()
    os._exit(code)
