"""The base model's held-out score on the real-model task, before any training.

    OMP_NUM_THREADS=1 python benchmarks/real_model_baseline.py      # about 10 minutes on 2 busy CPU cores

SmolLM2-135M-Instruct (``scripts/fetch_smollm2.py``'s checkpoint, fetched if needed) answers the 200 held-out
prompts of ``trl_ext.tasks.real_model.task`` ("What is forty-seven written in digits? Answer with just the number.",
after one arithmetic example turn) through its chat template: greedy once, then sampled ``--samples`` times per
prompt at each ``--temperatures`` (whole distribution: no top-k/top-p), ``--max-new-tokens`` each, one torch
thread. Graded by ``JustTheNumber`` (1 the number alone, 0.5 first line, 0.25 stated among words, 0 else).
Writes benchmarks/results/real-model-base-<device>.json: scores, the share of each grade, the share of answers
scoring above 0 (PPO needs some), the score per example turn, and examples.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="model folder (default: scripts/fetch_smollm2.py's, made if absent)")
    parser.add_argument("--samples", type=int, default=2, help="sampled answers per prompt at each temperature")
    parser.add_argument("--temperatures", default="0.7,1.0")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float32"),
        help="bfloat16: about 1.8x faster than float32 here (40 x 48 tokens: 23 s against 40 s)",
    )
    parser.add_argument("--limit", type=int, help="only the first N held-out prompts (a smoke run)")
    parser.add_argument("--out", help="results file (default: benchmarks/results/real-model-base-<device>.json)")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.runs.machine import cpu_name, device_tag, machine
    from trl_ext.tasks.real_model.checkpoint import FetchError, fetch_smollm2, read_marker
    from trl_ext.tasks.real_model.evaluate import score_rows
    from trl_ext.tasks.real_model.task import INSTRUCTION, QUESTION, JustTheNumber, heldout_rows

    torch.set_num_threads(1)
    try:
        folder = Path(args.checkpoint) if args.checkpoint else fetch_smollm2()
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, args.dtype)).eval()
    rows = heldout_rows()[: args.limit]
    settings = {
        "max_new_tokens": args.max_new_tokens,
        "dtype": args.dtype,
        "torch_threads": 1,
        "batch_size": 50,
        "held_out_prompts": len(rows),
    }

    start = time.perf_counter()
    greedy = score_rows(model, tokenizer, rows, max_new_tokens=args.max_new_tokens)
    print(f"greedy        score {greedy['score']:.3f}  grades {greedy['grades']}  ({greedy['seconds']} s)", flush=True)
    sampled = []
    for temperature in (float(t) for t in args.temperatures.split(",")):
        result = score_rows(
            model,
            tokenizer,
            rows,
            temperature=temperature,
            samples=args.samples,
            max_new_tokens=args.max_new_tokens,
            seed=1,
        )
        sampled.append(result)
        print(
            f"sampled T={temperature:<4} score {result['score']:.3f}  grades {result['grades']}  above 0 "
            f"{result['scoring_above_zero']:.3f}  ({result['seconds']} s)",
            flush=True,
        )

    info = dict(machine(), cpu=cpu_name())
    marker = read_marker(folder) or {}
    example = tokenizer.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=False)
    result = {
        "benchmark": "real-model-base",
        "machine": info,
        "command": (
            "OMP_NUM_THREADS=1 python benchmarks/real_model_baseline.py " + " ".join(argv or sys.argv[1:])
        ).strip(),
        "model": {
            "name": "SmolLM2-135M-Instruct",
            "source": marker.get("source"),
            "gguf_sha256": marker.get("gguf_sha256"),
            "vocab_size": model.config.vocab_size,
            "layers": model.config.num_hidden_layers,
            "eos": tokenizer.eos_token,
            "eos_id": tokenizer.eos_token_id,
        },
        "task": {
            "prompt_format": "chat template, add_generation_prompt=True; turns: user '<arithmetic question> "
            f"{INSTRUCTION}', assistant '<its answer>', user '{QUESTION} {INSTRUCTION}'",
            "rendered_example": example,
            "reward": "JustTheNumber: 1.0 the correct number alone; 0.5 first line the number alone, more text "
            "after; 0.25 the correct number stated among words; 0 a wrong or second number, or none",
            "credit": JustTheNumber().credit,
        },
        "settings": settings,
        "greedy": greedy,
        "sampled": sampled,
        "seconds": round(time.perf_counter() - start, 1),
    }
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"real-model-base-{device_tag(info)}.json"
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
