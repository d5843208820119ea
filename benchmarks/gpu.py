"""Both PPO backends on one GPU at real-LLM shapes (random weights, no download), bf16.

    python benchmarks/gpu.py                 # on a GPU machine: writes benchmarks/results/rlhf-gpu.json
    python benchmarks/gpu.py --tiny          # any machine: tiny shapes, checks this script (nothing written)

The policy is a Qwen2.5-0.5B-shaped ``Qwen2ForCausalLM`` and the reward model a DeBERTa-v3-base-shaped
``DebertaV2ForSequenceClassification`` (``num_labels=1``), both built from configs. For each backend
(``scratch``; ``trl`` where TRL <= 1.12 is installed) and with and without LoRA it runs ``--warmup``
then ``--updates`` timed PPO updates and reports episodes/s, tokens/s (prompt + response tokens that
went through the reward) and peak GPU memory. Without a GPU (and without ``--tiny``) it writes
nothing: a row is only ever a measurement.
"""

from __future__ import annotations

import argparse
import json
import string
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def char_tokenizer():
    """One token per printable character (the prompts are made of them), pad/eos/unk specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *sorted(set(string.printable) - set("\x0b\x0c"))])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_models(tiny: bool, dtype):
    import torch
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if tiny:
        policy_cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=1024)
        reward_cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          vocab_size=1024)
    else:  # Qwen2.5-0.5B and DeBERTa-v3-base shapes
        policy_cfg = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                          num_key_value_heads=2, vocab_size=151936)
        reward_cfg = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                          vocab_size=128100)
    policy = Qwen2ForCausalLM(Qwen2Config(**policy_cfg, max_position_embeddings=2048, tie_word_embeddings=True,
                                          eos_token_id=1, pad_token_id=0, bos_token_id=None)).to(dtype)
    reward = DebertaV2ForSequenceClassification(DebertaV2Config(**reward_cfg, num_labels=1, type_vocab_size=0,
                                                                max_position_embeddings=512,
                                                                pad_token_id=0)).to(dtype)
    return policy, reward


def measure(backend: str, lora: bool, args) -> dict:
    import torch
    from datasets import Dataset

    from trl_ext.ppo import PPOConfig
    from trl_ext.rewards import ClassifierReward

    gpu = torch.cuda.is_available()
    dtype = torch.bfloat16 if gpu else torch.float32
    policy, reward_model = build_models(args.tiny, dtype)
    tokenizer = char_tokenizer()
    tokenizer.padding_side = "left"
    counted = []
    scorer = ClassifierReward(reward_model, tokenizer, pair=True, name="deberta_rm")

    def reward(prompts, completions, **kwargs):
        counted.append(sum(len(tokenizer(p + c)["input_ids"]) for p, c in zip(prompts, completions)))
        return scorer(prompts, completions)

    reward.__name__ = "deberta_rm"
    total = args.batch_size * (args.warmup + args.updates)
    prompts = [f"Question {i}: what is {i} times {i + 3}? Answer briefly." for i in range(total)]
    data = Dataset.from_dict({"prompt": prompts, "input_ids": tokenizer(prompts)["input_ids"]})
    cfg = PPOConfig(batch_size=args.batch_size, total_episodes=total, response_length=args.response_length,
                    learning_rate=1e-5, num_ppo_epochs=1, kl_coef=0.05, vf_coef=0.1, top_k=50, top_p=0.95,
                    sampler="generate" if not args.tiny else "loop")
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    stamps = []

    def tick(*_):
        if gpu:
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())

    if gpu:
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as out:
        if backend == "scratch":
            from accelerate import Accelerator

            from trl_ext.ppo import PPOTrainer

            accelerator = Accelerator(mixed_precision="bf16" if gpu else "no", cpu=not gpu)
            trainer = PPOTrainer(policy, reward, args=cfg, train_dataset=data, processing_class=tokenizer,
                                 peft_config=peft_config, accelerator=accelerator)
            tick()
            trainer.train(lambda update, stats: tick())
        else:
            from transformers import TrainerCallback

            from trl_ext.trl_compat.backend import build_trl_trainer

            class _Tick(TrainerCallback):
                def on_log(self, a, state, control, logs=None, **kw):
                    if logs and "objective/scores" in logs:
                        tick()

            trainer = build_trl_trainer(cfg, policy, tokenizer, reward, data, out, callbacks=[_Tick()],
                                        peft_config=peft_config)
            tick()
            trainer.train()
    timed = stamps[args.warmup:]
    seconds = timed[-1] - timed[0]
    updates = len(timed) - 1
    tokens = sum(counted[args.warmup + 1:args.warmup + 1 + updates])
    return {"backend": backend, "lora": lora, "updates": updates,
            "episodes_per_second": round(updates * args.batch_size / seconds, 2),
            "tokens_per_second": round(tokens / seconds, 1),
            "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if gpu else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on any device: check the script only")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch

    from trl_ext.trl_compat import trl_ppo_available

    if not torch.cuda.is_available() and not args.tiny:
        print("no GPU here: nothing measured, nothing written (use --tiny to check the script)")
        return 2
    backends = ["scratch"] + (["trl"] if trl_ppo_available() else [])
    rows = []
    for backend in backends:
        for lora in (False, True):
            rows.append(measure(backend, lora, args))
            print(rows[-1], flush=True)
    if args.tiny:
        return 0
    from trl_ext.commands.demo import machine

    out = ROOT / "benchmarks" / "results" / "rlhf-gpu.json"
    out.write_text(json.dumps({"benchmark": "rlhf-ppo-gpu", "machine": machine(), "settings": vars(args),
                               "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
