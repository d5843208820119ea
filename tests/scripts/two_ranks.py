"""What the sharded two-rank harnesses share (fsdp2_two_ranks.py, zero3_two_ranks.py; launched with torchrun by
tests/launch.py's ``run_two_ranks``): a tiny GPT-2 policy on 16 doubling prompts, two updates of 2 epochs x 2
minibatches, and one JSON line per rank. A harness adds only how the model is sharded (its trainer subclass)
and how it reads the shards back.

Arguments: the sampler (default loop) and 'bf16': the policy as a bf16 checkpoint is (trainable weights
become float32 masters, the whole sharded module one dtype; the reference keeps bf16)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from datasets import Dataset

from trl_ext.models.digest import weights_digest
from trl_ext.ppo import PPOTrainer
from trl_ext.tasks.doubling.models import build_policy
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config
from trl_ext.tasks.doubling.tokenizer import build_tokenizer


def build_trainer(trainer_class: type[PPOTrainer]) -> PPOTrainer:
    torch.set_num_threads(1)
    args = sys.argv[1:]
    sampler = next((a for a in args if a != "bf16"), "loop")
    tokenizer = build_tokenizer()
    prompts = [tokenizer(f"S数字:{1000 + 37 * i}x2=")["input_ids"] for i in range(16)]
    policy = build_policy(tokenizer).to(torch.bfloat16 if "bf16" in args else torch.float32)
    return trainer_class(
        policy,
        lambda completions, **kw: [float(len(c)) for c in completions],
        args=doubling_ppo_config(
            batch_size=4, total_episodes=16, num_ppo_epochs=2, num_mini_batches=2, learning_rate=1e-2, sampler=sampler
        ),
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"input_ids": prompts}),
    )


def train_and_report(
    trainer: PPOTrainer,
    params: list[torch.nn.Parameter],
    whole: Callable[[], list[torch.Tensor]],
    after: Callable[[], dict] = dict,
    **facts,
) -> None:
    """Train, then print this rank's line: ``facts`` (read before training), ``after()`` (read after it), and
    what every harness reports. ``params``: the trained parameters as this rank holds them; ``whole()``: copies
    of them whole (gathered from the shards), in the same order."""
    before = whole()
    history = trainer.train()
    trained = whole()
    print(
        json.dumps(
            {
                "rank": dist.get_rank(),
                "world": dist.get_world_size(),
                **facts,
                **after(),
                "updates": len(history),
                "weights": weights_digest(trained),
                "moved": any(not torch.equal(a, b) for a, b in zip(before, trained)),
                "scores": [h["objective/scores"] for h in history],
                "dtypes": sorted({str(p.dtype) for p in params}),
                "reference_dtype": str(next(trainer.ref_policy.parameters()).dtype),
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()
