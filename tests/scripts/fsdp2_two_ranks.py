"""Launched with 2 processes (torchrun) by tests/test_sharded.py: the in-house rollout and update on a
tiny GPT-2 really sharded with PyTorch's FSDP2 over gloo (accelerate turns FSDP on only with GPUs, so
this subclass shards in the trainer's one wrapping hook). Prints one JSON line per rank.
Arguments: the sampler (default loop) and 'bf16': the policy as a bf16 checkpoint is (trainable weights
become float32 masters, the whole sharded module one dtype; the reference keeps bf16)."""

import json
import sys

import torch
import torch.distributed as dist
from datasets import Dataset
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from trl_ext.doubling.models import build_policy
from trl_ext.doubling.tokenizer import build_tokenizer
from trl_ext.doubling.ppo_settings import doubling_ppo_config
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
    torch.set_num_threads(1)
    args = sys.argv[1:]
    sampler = next((a for a in args if a != "bf16"), "loop")
    tokenizer = build_tokenizer()
    prompts = [tokenizer(f"S数字:{1000 + 37 * i}x2=")["input_ids"] for i in range(16)]
    policy = build_policy(tokenizer).to(torch.bfloat16 if "bf16" in args else torch.float32)
    trainer = FSDP2Trainer(policy, lambda completions, **kw: [float(len(c)) for c in completions],
                           args=doubling_ppo_config(batch_size=4, total_episodes=16, num_ppo_epochs=2,
                                                     num_mini_batches=2, learning_rate=1e-2, sampler=sampler),
                           processing_class=tokenizer, train_dataset=Dataset.from_dict({"input_ids": prompts}))
    model = trainer.model
    params = list(model.parameters())
    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    history = trainer.train()
    after = {n: p.full_tensor() for n, p in model.named_parameters()}
    checksum = sum(float(t.double().sum()) for t in after.values())
    sharded = all(isinstance(p, DTensor) for p in model.parameters())  # resharded after every rollout
    print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "local": local, "total": total,
                      "updates": len(history), "checksum": checksum, "sharded_after": sharded,
                      "moved": any(not torch.equal(before[n], after[n]) for n in before),
                      "scores": [h["objective/scores"] for h in history],
                      "dtypes": sorted({str(p.dtype) for p in params}),
                      "reference_dtype": str(next(trainer.ref_policy.parameters()).dtype)}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
