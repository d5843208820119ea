"""Launched with 2 processes by tests/test_ppo_trainer.py: rank 0's value loss turns NaN on its second
call; every rank must stop with the same error (none may hang in a barrier or a gradient all-reduce)."""

import sys

import torch
from datasets import Dataset

from trl_ext.ppo import PPOError, PPOTrainer, core
from trl_ext.tasks.doubling.models import build_policy
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config
from trl_ext.tasks.doubling.tokenizer import build_tokenizer


def main(out_dir: str) -> int:
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    policy = build_policy(tokenizer)
    prompts = Dataset.from_dict({"input_ids": [tokenizer("S数字:1234x2=")["input_ids"]] * 32})
    trainer = PPOTrainer(
        policy,
        lambda completions, **kw: [1.0] * len(completions),
        processing_class=tokenizer,
        args=doubling_ppo_config(batch_size=4, total_episodes=32, num_ppo_epochs=1, output_dir=out_dir),
        train_dataset=prompts,
    )
    real, calls = core.clipped_value_loss, {"n": 0}

    def nan_on_rank0(*args, **kwargs):
        calls["n"] += 1
        loss, stats = real(*args, **kwargs)
        bad = trainer.accelerator.process_index == 0 and calls["n"] > 1
        return (loss * float("nan") if bad else loss), stats

    core.clipped_value_loss = nan_on_rank0
    try:
        trainer.train()
    except PPOError as err:
        print(f"rank {trainer.accelerator.process_index} of {trainer.accelerator.num_processes}: {err}", flush=True)
        torch.distributed.destroy_process_group()
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
