"""Two training processes on CPU, each with its own colocated vLLM engine (launched with torchrun by
tests/test_vllm_sampler.py): a tiny GPT-2 with heads of 32, two updates at a large learning rate; each rank prints
one JSON line with its rank, the gaps between vLLM's log-probs and the trainer's of every update, and a digest of
its trained weights (DDP: equal on both ranks)."""

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_models

from tiny_models import char_tokenizer  # noqa: E402

from trl_ext.models.digest import weights_digest  # noqa: E402
from trl_ext.ppo.config import PPOConfig  # noqa: E402
from trl_ext.ppo.trainer import PPOTrainer  # noqa: E402

torch.set_num_threads(1)
tok = char_tokenizer(["<pad>", "<eos>", "<unk>"], pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
torch.manual_seed(0)
policy = GPT2LMHeadModel(
    GPT2Config(
        vocab_size=len(tok),
        n_embd=64,
        n_head=2,
        n_layer=2,
        n_positions=64,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
)
data = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in ["Hello", "abc", "x", "What?"] * 8]})
cfg = PPOConfig(
    sampler="vllm",
    learning_rate=1e-2,
    batch_size=4,
    total_episodes=16,
    response_length=6,
    temperature=0.7,
    num_ppo_epochs=1,
)
trainer = PPOTrainer(
    policy,
    lambda completions, **kw: [len(c) / 6 for c in completions],
    args=cfg,
    train_dataset=data,
    processing_class=tok,
)
history = trainer.train()
acc = trainer.accelerator
print(
    json.dumps(
        {
            "rank": acc.process_index,
            "world": acc.num_processes,
            "engine_seed": trainer.generator.initial_seed(),
            "gaps": [h["sampling/sampling_logp_difference/max"] for h in history],
            "weights": weights_digest(trainer.policy.parameters()),
        }
    ),
    flush=True,
)
