"""Launched with 2 processes (torchrun, DS_ACCELERATOR=cpu) by tests/test_sharded.py: the in-house rollout
and update on a tiny GPT-2 partitioned by DeepSpeed ZeRO-3 over gloo. accelerate does not run DeepSpeed on
CPU (its state sees one process per rank), so this subclass drives DeepSpeed directly in the trainer's
wrapping hook, and steps through the engine as accelerate does on GPUs. Prints one JSON line per rank.
Arguments: the sampler (default loop) and 'bf16': the policy as a bf16 checkpoint is (trainable weights
become float32 masters, the whole sharded module one dtype; the reference keeps bf16)."""

import json
import os
import sys

import deepspeed
import torch
import torch.distributed as dist
from datasets import Dataset

from trl_ext.doubling.models import build_policy
from trl_ext.doubling.tokenizer import build_tokenizer
from trl_ext.ppo import PPOTrainer
from trl_ext.ppo.config import mini_batch_size
from trl_ext.doubling.ppo_settings import doubling_ppo_config


class ZeRO3Trainer(PPOTrainer):
    def _shards_parameters(self):
        return True

    def _prepare(self, model):
        config = {
            "train_micro_batch_size_per_gpu": mini_batch_size(self.config),
            "gradient_accumulation_steps": 1,
            # 0: partition every parameter of a tiny model (the default keeps those under 100k elements whole)
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "optimizer": {"type": "AdamW", "params": {"lr": self.config.learning_rate, "eps": 1e-8,
                                                      "weight_decay": 0.0, "torch_adam": True}},
        }
        engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config,
                                                       model_parameters=[p for p in model.parameters()
                                                                         if p.requires_grad])
        return engine, optimizer

    def _backward(self, loss):
        self.model.backward(loss)

    def _optimizer_step(self):
        self.model.step()


def main() -> int:
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    args = sys.argv[1:]
    sampler = next((a for a in args if a != "bf16"), "loop")
    tokenizer = build_tokenizer()
    prompts = [tokenizer(f"S数字:{1000 + 37 * i}x2=")["input_ids"] for i in range(16)]
    policy = build_policy(tokenizer).to(torch.bfloat16 if "bf16" in args else torch.float32)
    trainer = ZeRO3Trainer(policy, lambda completions, **kw: [float(len(c)) for c in completions],
                           args=doubling_ppo_config(batch_size=4, total_episodes=16, num_ppo_epochs=2,
                                                     num_mini_batches=2, learning_rate=1e-2, sampler=sampler),
                           processing_class=tokenizer, train_dataset=Dataset.from_dict({"input_ids": prompts}))
    params = list(trainer.model.module.parameters())
    local = sum(p.ds_tensor.numel() for p in params)
    total = sum(p.ds_numel for p in params)
    empty_outside_forward = all(p.data.numel() == 0 for p in params)
    with deepspeed.zero.GatheredParameters(params):
        before = [p.detach().clone() for p in params]
    history = trainer.train()
    with deepspeed.zero.GatheredParameters(params):
        after = [p.detach().clone() for p in params]
    checksum = sum(float(t.double().sum()) for t in after)
    print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "local": local, "total": total,
                      "partitioned": empty_outside_forward, "updates": len(history), "checksum": checksum,
                      "moved": any(not torch.equal(a, b) for a, b in zip(before, after)),
                      "scores": [h["objective/scores"] for h in history],
                      "dtypes": sorted({str(p.dtype) for p in params}),
                      "reference_dtype": str(next(trainer.ref_policy.parameters()).dtype)}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Skip interpreter teardown: DeepSpeed's CPU comm and gloo leave C++ threads behind, and destroying
    # them at exit aborted one rank now and then ("terminate called without an active exception") after
    # its results were printed.
    sys.stdout.flush()
    os._exit(code)
