"""Two training processes on CPU sampling from one vLLM server (launched with torchrun by tests/test_vllm_server.py,
argv: the served model's folder and the server's URL): rank 0 syncs the weights, both ranks sample; each rank prints
one JSON line with its rank, every update's gap between the server's log-probs and its own, its sync count, and a
digest of its trained weights (DDP: equal on both ranks)."""

import json
import sys

import torch
from datasets import Dataset
from transformers import AutoTokenizer

from trl_ext.models.digest import weights_digest
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.trainer import PPOTrainer

torch.set_num_threads(1)
model_dir, url = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(model_dir)
data = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in ["the cat", "a dog ran", "one", "x y"] * 8]})
cfg = PPOConfig(
    sampler="vllm",
    vllm_mode="server",
    vllm_server_base_url=url,
    dtype="float32",
    learning_rate=1e-2,
    batch_size=4,
    total_episodes=16,
    response_length=6,
    temperature=0.7,
    num_ppo_epochs=1,
)
trainer = PPOTrainer(
    model_dir, lambda completions, **kw: [len(c) / 6 for c in completions], args=cfg, train_dataset=data,
    processing_class=tok,
)  # fmt: skip
history = trainer.train()
print(
    json.dumps(
        {
            "rank": trainer.accelerator.process_index,
            "world": trainer.accelerator.num_processes,
            "gaps": [h["sampling/sampling_logp_difference/max"] for h in history],
            "syncs": trainer.sampler.stats["syncs"],
            "weights": weights_digest(trainer.policy.parameters()),
        }
    ),
    flush=True,
)
