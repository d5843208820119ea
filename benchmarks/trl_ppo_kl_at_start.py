"""TRL 1.12's PPOTrainer alone (no trl-ext): the KL it logs at update 1, while the policy still equals its reference.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trl_ppo_kl_at_start.py [--model DIR] [--configs right-bf16,...]

SmolLM2-135M-Instruct (the folder ``scripts/fetch_smollm2.py`` makes), LoRA r=16 on all linear layers (so the
reference is the policy with its adapter off, and B = 0 makes them equal), a reward and a value model made from the
same checkpoint as TRL's examples make them, 16 chat prompts of different lengths, one update of 16 rollouts of up
to 32 tokens at T=0.7, the KL weight 0.05 (k1). Before any step the logged KL should be about 0. Each configuration
names the tokenizer's padding side and the models' dtype:

* ``right-*``: the side a checkpoint that sets no padding_side loads with. TRL's collator pads the queries on the
  right and TRL generates right after them: transformers' generate numbers the response from the last column's
  position (a pad's: 0), TRL's forward passes from the prompt's length, so the rollout's log-probs and the
  reference's are of two different sequences.
* ``left-*``: as TRL's examples set it. What remains in bf16 is TRL's own: it takes the rollout's log-probs from
  generate's scores (cached, one token at a time) and the reference's from one full forward, which bf16 rounds
  differently; in float32 the two agree.

Writes benchmarks/results/trl-ppo-kl-at-start.json (``--out``) and prints one line a configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("right-bfloat16", "left-bfloat16", "right-float32", "left-float32")
NUMBERS = [
    "seven",
    "forty-two",
    "ninety-nine",
    "thirteen",
    "sixty-one",
    "eight",
    "twenty-six",
    "fifty-five",
    "thirty",
    "eighty-four",
    "one",
    "seventy-three",
    "nineteen",
    "forty",
    "sixty-eight",
    "ninety",
]


def default_model_dir() -> Path:
    root = os.environ.get("TRL_EXT_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "trl-ext") / "SmolLM2-135M-Instruct"


def conversations() -> list[list[dict]]:
    """Prompts of different lengths (one or two turns), so every batch is padded."""
    rows = []
    for i, word in enumerate(NUMBERS):
        ask = {"role": "user", "content": f"What is {word} written in digits? Answer with just the number."}
        example = [
            {"role": "user", "content": "What is 3 + 4? Answer with just the number."},
            {"role": "assistant", "content": "7"},
        ]
        rows.append(example + [ask] if i % 2 else [ask])
    return rows


def kl_at_update_1(model_dir: Path, side: str, dtype_name: str, seed: int) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    dtype = getattr(torch, dtype_name)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side=side)
    # SmolLM2 pads with its eos, <|im_end|>, which ends every chat turn; TRL's PPO drops pad ids from a query, so
    # pad with a special token no prompt holds.
    tokenizer.pad_token = "<|endoftext|>"
    ids = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in conversations()]
    ids = [i["input_ids"] if hasattr(i, "keys") else i for i in ids]
    if any(tokenizer.pad_token_id in q for q in ids):
        raise SystemExit(f"error: the pad token {tokenizer.pad_token!r} occurs in the prompts")
    dataset = Dataset.from_dict({"input_ids": ids})

    torch.manual_seed(seed)  # the reward and value heads are new: the same init in every configuration
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    reward = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=dtype)
    value = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=dtype)
    with tempfile.TemporaryDirectory() as out:
        args = PPOConfig(
            output_dir=out,
            per_device_train_batch_size=16,
            gradient_accumulation_steps=1,
            local_rollout_forward_batch_size=16,
            total_episodes=16,
            num_ppo_epochs=1,
            num_mini_batches=1,
            response_length=32,
            temperature=0.7,
            kl_coef=0.05,
            kl_estimator="k1",
            stop_token="eos",
            seed=seed,
            num_sample_generations=0,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            bf16=False,
            use_cpu=not torch.cuda.is_available(),
            disable_tqdm=True,
        )
        trainer = PPOTrainer(
            args=args,
            processing_class=tokenizer,
            model=policy,
            ref_model=None,
            reward_model=reward,
            value_model=value,
            train_dataset=dataset,
            eval_dataset=dataset.select(range(16)),
            peft_config=LoraConfig(
                task_type="CAUSAL_LM", r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear"
            ),
        )
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    logs = [h for h in trainer.state.log_history if "objective/kl" in h]
    padded = sum(len(q) < max(map(len, ids)) for q in ids)
    return {
        "config": f"{side}-{dtype_name}",
        "padding_side": side,
        "dtype": dtype_name,
        "update1_kl": round(logs[0]["objective/kl"], 4),
        "prompts_padded": padded,
        "prompts": len(ids),
        "seconds": round(seconds, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(default_model_dir()), help="SmolLM2-135M-Instruct's folder")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of " + ", ".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "trl-ppo-kl-at-start.json"))
    args = parser.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {list(CONFIGS)}")
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        parser.error(f"{model_dir} holds no checkpoint: make it with `python scripts/fetch_smollm2.py` or give --model")
    import torch
    import trl

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rows = []
    for config in configs:
        side, dtype_name = config.split("-")
        rows.append(kl_at_update_1(model_dir, side, dtype_name, args.seed))
        print(
            f"{config}: update-1 KL {rows[-1]['update1_kl']:.4f} nats an answer "
            f"({rows[-1]['prompts_padded']}/{rows[-1]['prompts']} prompts padded, {rows[-1]['seconds']} s)",
            flush=True,
        )
    command = " ".join(
        ["OMP_NUM_THREADS=1 python benchmarks/trl_ppo_kl_at_start.py", *(argv if argv is not None else sys.argv[1:])]
    )
    result = {
        "benchmark": "trl-ppo-kl-at-start",
        "command": command.strip(),
        "trl": trl.__version__,
        "torch": torch.__version__,
        "platform": platform.platform(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
