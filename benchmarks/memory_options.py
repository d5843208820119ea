"""Peak memory of the scratch trainer under its memory options, each in a fresh process (CPU or GPU).

    OMP_NUM_THREADS=1 python benchmarks/memory_options.py   # writes benchmarks/results/memory-options-<device>.json

A Qwen2-architecture policy built from a config (random weights, no download; about 45M parameters
by default) runs ``--updates`` PPO updates with a scalar reward function under each setting:

* ``full + reference copy``: full fine-tuning, the reference a frozen deep copy (the default without LoRA);
* ``full + gradient checkpointing``: the same with ``gradient_checkpointing=True``;
* ``LoRA + reference copy``: LoRA, and a second full copy of the base model as the reference (what
  trl-ext did before the reference became the adapters-off model);
* ``LoRA + adapters-off reference``: LoRA, the reference is the same model with its adapters disabled;
* ``full + chunked LM head`` and ``full + gradient checkpointing + chunked LM head``: ``chunked_lm_head=True``, the
  log-probs from the hidden states without a ``(rows, tokens, vocabulary)`` logits tensor.

``--settings`` runs some of them; ``--rows-per-pass N`` sets the experience and update passes' rows (0: automatic,
which on CPU already keeps a pass's logits under 2**27 values; the whole batch, as a GPU's automatic size takes it,
shows what the logits cost); ``--out`` names the results file.

On CPU the figure is the process's peak resident set (``ru_maxrss``), on a GPU the peak allocated
GPU memory. Each setting runs in its own process so that peaks do not mix.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "full + reference copy": {"lora": False, "checkpointing": False, "reference_copy": True},
    "full + gradient checkpointing": {"lora": False, "checkpointing": True, "reference_copy": True},
    "LoRA + reference copy": {"lora": True, "checkpointing": False, "reference_copy": True},
    "LoRA + adapters-off reference": {"lora": True, "checkpointing": False, "reference_copy": False},
    "full + chunked LM head": {"lora": False, "checkpointing": False, "reference_copy": True, "chunked": True},
    "full + gradient checkpointing + chunked LM head": {
        "lora": False,
        "checkpointing": True,
        "reference_copy": True,
        "chunked": True,
    },
}


def one_setting(name: str, args) -> dict:
    """Runs inside the child process: build, train, report the peak."""
    import copy
    import resource

    import torch
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trl_ext.ppo import PPOConfig, PPOTrainer

    setting = SETTINGS[name]
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=1,
        pad_token_id=0,
    )
    policy = Qwen2ForCausalLM(config)
    tokenizer = _ids_tokenizer()
    prompts = Dataset.from_dict(
        {
            "input_ids": [
                [2 + (7 * i + j) % (args.vocab - 2) for j in range(args.prompt_length)]
                for i in range(args.batch_size * args.updates)
            ]
        }
    )
    peft_config = None
    if setting["lora"]:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    reference = copy.deepcopy(policy) if setting["reference_copy"] and setting["lora"] else None
    trainer = PPOTrainer(
        policy,
        lambda completion_ids, **kw: [len(ids) / 8 for ids in completion_ids],
        args=PPOConfig(
            batch_size=args.batch_size,
            total_episodes=args.batch_size * args.updates,
            response_length=args.response_length,
            num_ppo_epochs=1,
            learning_rate=1e-5,
            gradient_checkpointing=setting["checkpointing"],
            chunked_lm_head=setting.get("chunked", False),
            local_rollout_forward_batch_size=args.rows_per_pass,
            micro_batch_size=args.rows_per_pass,
        ),
        processing_class=tokenizer,
        train_dataset=prompts,
        peft_config=peft_config,
        ref_model=reference,
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if torch.cuda.is_available()
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    parameters = sum(p.numel() for p in trainer.actor_critic.parameters())
    return {
        "setting": name,
        "peak_mb": round(peak, 1),
        "parameters": parameters,
        "trainable": sum(p.numel() for p in trainer.actor_critic.parameters() if p.requires_grad),
    }


def _ids_tokenizer():
    """A tokenizer object with the ids the trainer needs (the prompts are token ids already)."""
    from types import SimpleNamespace

    def batch_decode(ids, skip_special_tokens=True):
        return [" ".join(map(str, row)) for row in ids]

    return SimpleNamespace(
        eos_token_id=1,
        pad_token_id=0,
        eos_token="<eos>",
        pad_token="<pad>",
        batch_decode=batch_decode,
        name_or_path="ids",
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--rows-per-pass", type=int, default=0, help="rows a forward pass (0: automatic)")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="some of the settings, comma-separated")
    parser.add_argument("--out", help="results file (default: benchmarks/results/memory-options-<device>.json)")
    parser.add_argument("--setting", choices=list(SETTINGS), help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.settings.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SETTINGS]
    if unknown or not chosen:
        parser.error(f"--settings: unknown {', '.join(unknown) or 'nothing'}; choose from {', '.join(SETTINGS)}")
    sys.path.insert(0, str(ROOT))
    if args.setting:
        print(json.dumps(one_setting(args.setting, args)))
        return 0
    rows = []
    for name in chosen:
        child = [sys.executable, __file__, "--setting", name, *(argv if argv is not None else sys.argv[1:])]
        run = subprocess.run(
            child, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        )
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            return run.returncode
        rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    from trl_ext.runs.machine import machine

    base = rows[0]["peak_mb"]
    for row in rows:
        row["saved_mb_vs_full"] = round(base - row["peak_mb"], 1)
    info = machine()
    device = "gpu" if info["device"] != "cpu" else "cpu"
    result = {
        "benchmark": "ppo-memory-options",
        "machine": info,
        "settings": {k: v for k, v in vars(args).items() if k not in ("setting", "settings", "out")},
        "measure": "peak GPU memory allocated (MB)" if device == "gpu" else "peak resident set size (MB)",
        "rows": rows,
    }
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"memory-options-{device}.json"
    from benchmarks.harness import write_results
    from benchmarks.tables import invocation

    write_results(out, result, lambda _written: results_table(out, invocation()))
    print(f"wrote {out} and its .md")
    return 0


def results_table(name, made_by: str) -> str:
    """The file's table: each setting's peak memory, trainable parameters and saving."""
    from benchmarks.tables import load, source_line

    data = load(name)
    s = data["settings"]
    lines = [
        source_line(name, made_by) + f" A Qwen2-architecture policy built from a config (hidden {s['hidden']}, "
        f"{s['layers']} layers, vocabulary {s['vocab']:,}), batch {s['batch_size']}, {s['prompt_length']}-token "
        f"prompts and {s['response_length']}-token responses, {s['updates']} updates, "
        f"{s.get('rows_per_pass') or 'automatic'} rows a pass, each setting in a fresh process; {data['measure']}.",
        "",
        "| setting | peak MB | trainable parameters | saved vs full + reference copy (MB) |",
        "|---|---|---|---|",
    ]
    for row in data["rows"]:
        lines.append(
            f"| {row['setting']} | {row['peak_mb']:.1f} | {row['trainable']:,} of {row['parameters']:,} | "
            f"{row['saved_mb_vs_full']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
