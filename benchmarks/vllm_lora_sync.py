"""Sync bytes and seconds of a LoRA policy on vLLM: the adapter sent alone (``vllm_lora_sync="adapter"``) against
the merged model (``"merged"``), in one invocation, each sync after the same move of the adapter, then one rollout
from each on the same seeds (each one's log-probs against the policy's forward).

Colocated (default): two engines, syncs taken in turns (adapter, merged, adapter, ...). ``--mode server``: one
``LocalServer`` started with ``--enable-lora``, the adapter's syncs first, then the merged ones (a merged sync
replaces the server's base, under which an adapter would no longer be the policy).

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_lora_sync.py            # SmolLM2-135M-Instruct, bf16
    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_lora_sync.py --mode server --rank 16 --syncs 5

A measurement for issue 84's first item, not its benchmark (item 4: both modes, Qwen2.5-Coder-0.5B, learning).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def _first_sync(engine, model, ids, mask, options, first: dict, name: str) -> None:
    """The engine's start (or connection) and first sync, the base included, then its first rollout."""
    engine.sample(model, ids, mask, options, torch.Generator().manual_seed(0))
    first[name] = (engine.stats["last_sync_bytes"], engine.stats["last_sync_seconds"])


def _rollout_seconds(engines, tok) -> dict:
    """Median seconds of a rollout of 16 prompts x 48 new tokens (eos may end a row), the engines in turns (on the
    server: each after its own syncs)."""
    import time

    from trl_ext.data.batching import pad_batch
    from trl_ext.ppo.rollout.interface import SamplingOptions

    rows = [tok(f"Write a long story about the number {i}.")["input_ids"] for i in range(16)]
    ids, mask = pad_batch(rows, tok.pad_token_id or 0, side="left")
    options = SamplingOptions(max_new_tokens=48, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id or 0)
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for repeat in range(3):
        for name, engine in engines.items():
            start = time.perf_counter()
            engine.generate(ids, mask, options, torch.Generator().manual_seed(repeat))
            seconds[name].append(time.perf_counter() - start)
    return {name: round(statistics.median(s), 3) for name, s in seconds.items()}


@torch.no_grad()
def _gap(model, ids, mask, out, eos_token_id) -> float:
    """The largest difference between the engine's log-probs of its samples and the policy's forward ones."""
    from trl_ext.data.sequences import positions_from_mask, response_mask

    kept = response_mask(out.ids, eos_token_id)
    attention = torch.cat([mask, kept], 1)
    full = torch.cat([ids, out.ids], 1)
    logits = model(input_ids=full, attention_mask=attention, position_ids=positions_from_mask(attention)).logits
    ours = torch.log_softmax(logits[:, ids.shape[1] - 1 : -1].float(), -1).gather(-1, out.ids[..., None]).squeeze(-1)
    return (ours - out.logprobs)[kept.bool()].abs().max().item()


def main(argv: list[str] | None = None) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.data.batching import pad_batch
    from trl_ext.ppo.config import PPOConfig
    from trl_ext.ppo.rollout.interface import SamplingOptions
    from trl_ext.ppo.rollout.vllm_sampler import VLLMSampler

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a checkpoint folder (default: SmolLM2-135M-Instruct, fetched once)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--mode", choices=("colocate", "server"), default="colocate")
    args = parser.parse_args(argv)
    if args.model is None:
        from trl_ext.tasks.real_model.checkpoint import fetch_smollm2

        args.model = str(fetch_smollm2())
    tok = AutoTokenizer.from_pretrained(args.model)
    base = AutoModelForCausalLM.from_pretrained(args.model)
    lora = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(base, lora).eval()
    prompts = ["Tell me a story.", "What is 2 + 2?", "Name a colour.", "Write a haiku."]
    ids, mask = pad_batch([tok(p)["input_ids"] for p in prompts], tok.pad_token_id or 0, side="left")
    options = SamplingOptions(max_new_tokens=16, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id or 0)
    server = None
    if args.mode == "server":
        import tempfile

        from trl_ext.ppo.rollout.local_server import LocalServer
        from trl_ext.ppo.rollout.lora_sync import engine_lora_rank
        from trl_ext.ppo.rollout.vllm_server import VLLMServerSampler

        log = tempfile.NamedTemporaryFile(prefix="vllm-lora-server-", suffix=".log", delete=False).name
        server = LocalServer(args.model, log, max_lora_rank=engine_lora_rank(args.rank), max_model_len=512)
        engines = {
            s: VLLMServerSampler(PPOConfig(sampler="vllm", vllm_mode="server", vllm_server_base_url=server.url,
                                           vllm_lora_sync=s))
            for s in ("adapter", "merged")
        }  # fmt: skip
        rounds = [["adapter"]] * args.syncs + [["merged"]] * args.syncs
    else:
        engines = {s: VLLMSampler(PPOConfig(sampler="vllm", vllm_lora_sync=s)) for s in ("adapter", "merged")}
        rounds = [["adapter", "merged"]] * args.syncs
    first, seconds, outs, rollout = {}, {name: [] for name in engines}, {}, {}
    try:
        for name in engines if server is None else ["adapter"]:
            _first_sync(engines[name], model, ids, mask, options, first, name)
        for step, names in enumerate(rounds):
            if server is not None and step == args.syncs:  # the adapter's part done: its rollout, then merged
                outs["adapter"] = engines["adapter"].sample(model, ids, mask, options, torch.Generator().manual_seed(1))
                rollout.update(_rollout_seconds({"adapter": engines["adapter"]}, tok))
                _first_sync(engines["merged"], model, ids, mask, options, first, "merged")
            torch.manual_seed(step)
            with torch.no_grad():  # an update's worth of change to the adapter
                for n, p in model.named_parameters():
                    if "lora_" in n:
                        p.add_(torch.randn_like(p) * 1e-3)
            for name in names:
                engines[name].policy_changed()
                engines[name].prepare(model, ids.device)
                seconds[name].append(engines[name].stats["last_sync_seconds"])
        for name, engine in engines.items():
            if name not in outs:
                outs[name] = engine.sample(model, ids, mask, options, torch.Generator().manual_seed(1))
        rollout.update(_rollout_seconds(engines if server is None else {"merged": engines["merged"]}, tok))
    finally:
        if server is not None:
            server.stop()
    same = torch.equal(outs["adapter"].ids, outs["merged"].ids)
    gaps = {n: _gap(model, ids, mask, out, tok.eos_token_id) for n, out in outs.items()}
    result = {
        "model": args.model,
        "rank": args.rank,
        "mode": args.mode,
        "lora_sync": {n: e.lora_sync for n, e in engines.items()},
        "first_sync": {n: {"bytes": b, "seconds": round(s, 4)} for n, (b, s) in first.items()},
        "sync_bytes": {n: e.stats["last_sync_bytes"] for n, e in engines.items()},
        "sync_seconds_median": {n: round(statistics.median(s), 4) for n, s in seconds.items()},
        "sync_seconds": {n: [round(x, 4) for x in s] for n, s in seconds.items()},
        "logprob_gap_to_the_trainer_max": gaps,  # each engine's log-probs against the PEFT model's forward
        "same_tokens": same,
        "rollout_seconds_median": rollout,  # 16 prompts x 48 tokens, 3 rollouts each
        "max_logprob_difference": (outs["adapter"].logprobs - outs["merged"].logprobs).abs().max().item()
        if same
        else None,
    }
    result["bytes_ratio"] = round(result["sync_bytes"]["adapter"] / result["sync_bytes"]["merged"], 4)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
