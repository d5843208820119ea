"""The scratch trainer (each sampler), TRL 1.12's PPOTrainer and TRL's GRPOTrainer on one GPU, in one run.

    python benchmarks/gpu.py --trl-ppo /opt/trl112 --trl-latest /opt/trl116   # writes benchmarks/results/rlhf-gpu.json
    python benchmarks/gpu.py --tiny --trl-ppo .venv --trl-latest .venv-latest   # any machine: checks the script

Same models, reward, prompts, batch and response length for every row: a Qwen2.5-0.5B-shaped policy and a
DeBERTa-v3-base-shaped reward model (``num_labels=1``), built from configs with random weights (no download), bf16;
top-k 50, top-p 0.95, temperature 1; shapes (prompts per update / response tokens) 16/64, 64/128 and 256/128. Rows:
``trl-ext/loop``, ``trl-ext/static``, ``trl-ext/static-copy`` (the static sampler over a bf16 copy of the policy, LoRA
merged), ``trl-ext/generate``, ``trl-ext/generate-static`` (``generate`` with
transformers' static cache, which compiles the forward itself), ``trl-ext/vllm`` (the scratch trainer with each
sampler; ``--sampler vllm`` runs that row alone, ``trl-ext/vllm-sleep`` the same with ``vllm_enable_sleep_mode``),
``trl-ppo`` (TRL 1.12's ``PPOTrainer``) and ``trl-grpo`` (the newest TRL's ``GRPOTrainer``, 8 completions per prompt);
``--lora`` adds each with LoRA (r 16, all linear layers). A row name takes options after ``+``: ``lora``, ``gc``
(activation checkpointing), ``critic`` (the critic as a second LoRA adapter), ``mbN`` (N rows a forward pass),
``adam8`` (torchao's 8-bit AdamW), ``chunked`` (``chunked_lm_head``) and ``freeze`` (``gc.freeze()`` after the
untimed updates; every row reports Python's collection pauses per update).
``--model 7b`` makes the policy Qwen2.5-7B-shaped (built on the GPU) and the reward model Qwen2.5-0.5B-shaped;
``--deadline S`` starts no row after S seconds; ``--profile`` runs one more update after the timed ones, its phases
profiled (``benchmarks/gpu_profile.py``: busiest kernels, device time, memory held and peak per phase), reported
apart under ``profile``. Each row runs in a fresh process, so peak memory and compiled graphs
are its own, with the Python of a virtual environment or a ``pip install --target`` folder put first on
``PYTHONPATH``: ``--trl-ppo`` for the TRL-1.12 row, ``--vllm-env`` for the vLLM rows (an environment with CUDA vLLM:
``pip install 'trl-ext[vllm]'``; default: ``--trl-latest``), ``--trl-latest`` for the others (default: this Python). A
vLLM row also gives its engine start, weight syncs (count, seconds) and the GPU memory in use at its end (vLLM's pools
are not all torch's: ``peak_gpu_mb`` alone would undercount them); where vLLM is not installed it fails, saying what
it needs, and is not written. None of the vLLM rows has been run on a GPU yet. A row reports, over ``--updates`` timed
updates after ``--warmup`` untimed ones (compiling happens there, reported apart): episodes/s, tokens/s (each
episode's prompt and response tokens through the whole update), generated tokens/s (sampled token ids up to and
including the first eos), ms per decode step (generation time over the decoding steps, the prefill included), the
share of the update spent generating, peak GPU memory, trainable parameters (LoRA applied or not), graphs compiled
while timed, and for trl-ext rows the trainer's ``timing/*`` phases per update and their sum's share of the wall clock
(the trainer synchronises the GPU before each reading: about 1). A row that fails (out of memory) is listed under
``failed`` with its last error line; a row that was not run is not written. The results file and its table (``.md``
beside it) are rewritten after every row, so a run cut short keeps what it measured. Without a GPU (and without
``--tiny``) nothing is measured and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.gpu_profile import summary as profile_summary  # noqa: E402
from benchmarks.harness import ROOT, git_commit, rewrite_table, write_results  # noqa: E402

ROWS = (
    "trl-ext/loop",
    "trl-ext/static",
    "trl-ext/static-copy",
    "trl-ext/generate",
    "trl-ext/generate-static",
    "trl-ext/vllm",
    "trl-ext/vllm-sleep",
    "trl-ppo",
    "trl-grpo",
)
DEFAULT_ROWS = tuple(r for r in ROWS if r != "trl-ext/vllm-sleep")
# A row name may end in options, each after a "+": "lora" (LoRA r 16 on all linear layers), "gc" (activation
# checkpointing), "critic" (the critic as a second LoRA adapter, ``critic_adapter``; needs "lora") and "mbN"
# (trl-ext rows: N rows per forward pass of the experience phase and per forward/backward of the update, in place
# of the automatic size); "freeze" (any row: ``gc.freeze()`` once the untimed updates are done, so Python's full
# collections no longer walk the objects compiling and loading made: the test of one cause of a slow update);
# "adam8" (any row: ``optim="adamw_torch_8bit"``, torchao's 8-bit AdamW, TRL's trainers by the same name);
# "chunked" (trl-ext rows: ``chunked_lm_head``, log-probs from the hidden states without the whole logits).
OPTION = re.compile(r"lora|gc|critic|freeze|adam8|chunked|mb[1-9]\d*")
MODELS = ("0.5b", "7b")


def row_parts(row: str) -> tuple[str, set[str], int]:
    """``row``'s trainer, its options and its rows a pass (0: automatic); ValueError naming what is wrong."""
    name, *options = row.split("+")
    if name not in ROWS:
        raise ValueError(f"unknown row {row!r}: choose from {', '.join(ROWS)}")
    bad = [o for o in options if not OPTION.fullmatch(o)]
    if bad:
        raise ValueError(
            f"row {row!r}: unknown option(s) {', '.join(bad)} (lora, gc, critic, freeze, adam8, chunked, mbN)"
        )
    trl_only = [o for o in options if o in ("gc", "critic", "chunked") or o.startswith("mb")]
    if trl_only and not name.startswith("trl-ext/"):
        raise ValueError(
            f"row {row!r}: {', '.join(trl_only)} are trl-ext's settings; TRL's trainers here take lora only"
        )
    if "critic" in options and "lora" not in options:
        raise ValueError(f"row {row!r}: 'critic' is the critic as a second LoRA adapter, so it needs 'lora'")
    micro = next((int(o[2:]) for o in options if o.startswith("mb")), 0)
    return name, {o for o in options if not o.startswith("mb")}, micro


SHAPES = ("16x64", "64x128", "256x128")
RESULT = "RESULT "


def char_tokenizer():
    """One token per printable character (the prompts are made of them), pad/eos/unk specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *sorted(set(string.printable) - set("\x0b\x0c"))])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.padding_side = "left"
    return tokenizer


# Policy shapes: Qwen2.5-0.5B and Qwen2.5-7B (its head untied); --tiny keeps each one's kind at a few thousand
# parameters (heads of 32: the smallest vLLM's CPU attention runs).
POLICY_SHAPES = {
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}
TINY_POLICY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=1024,
)


def build_models(tiny: bool, model: str, dtype):
    """The policy of shape ``model`` and its reward model, random weights in ``dtype``, built on the GPU where there
    is one (a 7B policy is made there in seconds). The 0.5B policy's reward model is DeBERTa-v3-base-shaped, the 7B
    one's Qwen2.5-0.5B-shaped (a classifier head of one label)."""
    import torch
    from transformers import (
        DebertaV2Config,
        DebertaV2ForSequenceClassification,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2ForSequenceClassification,
    )

    torch.manual_seed(0)
    specials = dict(eos_token_id=1, pad_token_id=0, bos_token_id=None, max_position_embeddings=2048)
    policy_cfg = {**POLICY_SHAPES[model], **(TINY_POLICY if tiny else {})}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            policy = Qwen2ForCausalLM(Qwen2Config(**policy_cfg, **specials))
            if model == "7b":
                reward_cfg = {**POLICY_SHAPES["0.5b"], **(TINY_POLICY if tiny else {})}
                reward = Qwen2ForSequenceClassification(Qwen2Config(**reward_cfg, **specials, num_labels=1))
            else:
                reward_cfg = dict(
                    hidden_size=768,
                    intermediate_size=3072,
                    num_hidden_layers=12,
                    num_attention_heads=12,
                    vocab_size=128100,
                )
                if tiny:
                    reward_cfg = dict(
                        hidden_size=32,
                        intermediate_size=64,
                        num_hidden_layers=1,
                        num_attention_heads=2,
                        vocab_size=1024,
                    )
                reward = DebertaV2ForSequenceClassification(
                    DebertaV2Config(
                        **reward_cfg, num_labels=1, type_vocab_size=0, max_position_embeddings=512, pad_token_id=0
                    )
                )
    finally:
        torch.set_default_dtype(default_dtype)
    return policy.to(dtype), reward.to(dtype)


# Counters of the CUDA caching allocator: retries (a malloc that failed, the cache freed and tried again: each
# synchronises the device) and the device allocations and frees under it (cudaMalloc/cudaFree, slow when large).
ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms")


def gpu_clocks() -> dict | None:
    """The card's SM and memory clocks (MHz), power draw (W) and temperature now, as nvidia-smi reads them."""
    fields = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")
    try:
        line = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.splitlines()[0]
        return dict(zip(fields, (float(v) for v in line.split(","))))
    except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
        return None


class Clock:
    """Update boundaries and generation time, each read after a device synchronisation; Python's garbage
    collections (their pauses, and how many were full) between boundaries."""

    def __init__(self, gpu: bool, eos_token_id: int, warmup: int, freeze: bool = False, profiler=None, timed=0):
        import gc

        self.gpu, self.eos_token_id, self.warmup, self.freeze = gpu, eos_token_id, warmup, freeze
        self.profiler, self.timed = profiler, timed  # profiled: the update after the ``timed`` ones
        self.gc_seconds, self.full_collections, self._gc_began = 0.0, 0, 0.0
        gc.callbacks.append(self._collecting)
        self.clocks_at_start: dict | None = None  # nvidia-smi's reading as the timed updates begin
        self.stamps: list[tuple] = []  # (time, generate seconds, decode steps, generated tokens, graphs) so far
        self.generate_seconds, self.steps, self.tokens = 0.0, 0, 0
        self.phases: list[dict] = []  # the scratch trainer's timing/* stats of each update
        self.allocator: list[dict] = []  # the CUDA caching allocator's counters at each boundary

    def _collecting(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self._gc_began
            self.full_collections += info["generation"] == 2

    def now(self) -> float:
        if self.gpu:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def update_done(self, update=None, stats=None) -> None:
        from torch._dynamo.utils import counters

        if stats is not None:
            self.phases.append({k: v for k, v in stats.items() if k.startswith("timing/") and k != "timing/elapsed"})

        graphs = counters["stats"]["unique_graphs"]  # every graph torch.compile has made in this process
        if len(self.stamps) == self.warmup:  # before the stamp: its time is not the timed updates'
            if self.gpu:
                self.clocks_at_start = gpu_clocks()
            if self.freeze:
                import gc

                gc.freeze()
        if self.profiler is not None and len(self.stamps) == self.warmup + self.timed:
            self.profiler.start()
        self.stamps.append(
            (self.now(), self.generate_seconds, self.steps, self.tokens, graphs, self.gc_seconds, self.full_collections)
        )
        if self.gpu:
            import torch

            stats = torch.cuda.memory_stats()
            self.allocator.append({k: stats.get(k, 0) for k in ALLOCATOR_COUNTERS})

    def count(self, responses) -> None:
        """``responses``: ``(B, R)`` sampled ids; counts the ids up to and including each row's first eos."""
        from trl_ext.data.sequences import response_mask

        self.steps += responses.shape[1]
        self.tokens += int(response_mask(responses, self.eos_token_id).sum())

    def timing(self, function, responses_of):
        """``function`` timed into ``generate_seconds``; ``responses_of(result)`` is what it sampled."""

        def timed(*args, **kwargs):
            start = self.now()
            result = function(*args, **kwargs)
            self.generate_seconds += self.now() - start
            self.count(responses_of(result, *args, **kwargs))
            return result

        return timed


def measure(row: str, batch_size: int, response_length: int, args) -> dict:
    import torch
    from datasets import Dataset

    from benchmarks.gpu_profile import PhaseProfiler
    from trl_ext.ppo import PPOConfig
    from trl_ext.ppo.optimizers import optimizer_state_bytes
    from trl_ext.rewards import ClassifierReward

    gpu = torch.cuda.is_available()
    dtype = torch.bfloat16 if gpu else torch.float32
    name, options, micro = row_parts(row)
    lora = "lora" in options
    policy, reward_model = build_models(args.tiny, args.model, dtype)
    tokenizer = char_tokenizer()
    reward = ClassifierReward(reward_model, tokenizer, pair=True, name="deberta_rm")
    updates = args.warmup + args.updates + args.profile  # the profiled update last, apart
    episodes = batch_size * updates
    prompts = [f"Question {i}: what is {i} times {i + 3}? Answer briefly." for i in range(episodes)]
    data = Dataset.from_dict({"prompt": prompts, "input_ids": tokenizer(prompts)["input_ids"]})
    sampling = dict(temperature=1.0, top_k=50, top_p=0.95)
    sampler = name.split("/")[1] if name.startswith("trl-ext/") else "auto"
    if sampler == "generate-static":  # transformers' own path: generate() with a static cache compiles its forward
        policy.generation_config.cache_implementation = "static"
        sampler = "generate"
    vllm_options = {}
    if sampler.startswith("vllm"):
        from trl_ext.ppo.rollout.vllm_sampler import INSTALL_HINT, vllm_installed

        if not vllm_installed():
            raise SystemExit(f"{row}: needs vLLM in this row's environment (--vllm-env): {INSTALL_HINT}")
        vllm_options = dict(
            vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            vllm_enable_sleep_mode=sampler.endswith("-sleep"),
        )
        sampler = "vllm"
    cfg = PPOConfig(
        batch_size=batch_size,
        total_episodes=episodes,
        response_length=response_length,
        learning_rate=1e-5,
        lr_scheduler_type="constant",  # so the profiled update, run after the timed ones, changes none of their rates
        num_ppo_epochs=1,
        kl_coef=0.05,
        vf_coef=0.1,
        **sampling,
        sampler=sampler,
        local_rollout_forward_batch_size=micro,
        micro_batch_size=micro,
        gradient_checkpointing="gc" in options,
        critic_adapter="critic" in options,
        chunked_lm_head="chunked" in options,
        optim="adamw_torch_8bit" if "adam8" in options else "adamw_torch_fused",
        **vllm_options,
    )
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    profiler = PhaseProfiler(gpu) if args.profile else None
    clock = Clock(gpu, tokenizer.eos_token_id, args.warmup, "freeze" in options, profiler, args.updates)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as out:
        if name.startswith("trl-ext/"):
            from accelerate import Accelerator

            from trl_ext.ppo import PPOTrainer

            trainer = PPOTrainer(
                policy,
                reward,
                args=cfg,
                train_dataset=data,
                processing_class=tokenizer,
                peft_config=peft_config,
                accelerator=Accelerator(mixed_precision="bf16" if gpu else "no", cpu=not gpu),
            )
            assert trainer.sampler_name == cfg.sampler
            trainer.sampling.completions = clock.timing(
                trainer.sampling.completions, lambda completions, *a, **k: completions.ids
            )
            if profiler is not None:
                trainer.rollout.rollout = profiler.wrap("generate", trainer.rollout.rollout)
                trainer.rewards.score = profiler.wrap("reward", trainer.rewards.score)
                trainer._experience = profiler.wrap("experience", trainer._experience)
                trainer._update = profiler.wrap("update", trainer._update)
            model, run = trainer.model, lambda: trainer.train(clock.update_done)
        else:
            from transformers import TrainerCallback

            # Both TRL trainers sample with the policy's own generate (through PEFT's when wrapped).
            generate = profiler.wrap("generate", policy.generate) if profiler is not None else policy.generate
            policy.generate = clock.timing(  # TRL's PPO asks for a dict output, GRPO for the ids
                generate, lambda out, *a, **k: getattr(out, "sequences", out)[:, k["input_ids"].shape[1] :]
            )

            class Boundaries(TrainerCallback):
                def on_step_end(self, *_, **__):
                    clock.update_done()

            if name == "trl-ppo":
                from trl_ext.trl_compat import trl_ppo_available, trl_ppo_unavailable_reason

                if not trl_ppo_available():
                    raise SystemExit(f"{row}: {trl_ppo_unavailable_reason()} (pass --trl-ppo with TRL 1.12)")
                from trl_ext.trl_compat.backend import build_trl_trainer

                trainer = build_trl_trainer(
                    cfg, policy, tokenizer, reward, data, out, callbacks=[Boundaries()], peft_config=peft_config
                )
                # TRL's own default: its rollout forwards in chunks of 64 rather than the whole batch.
                trainer.args.local_rollout_forward_batch_size = min(64, batch_size)
            else:
                from trl import GRPOConfig, GRPOTrainer

                from trl_ext.ppo.optimizers import optimizer_training_argument

                grpo_args = GRPOConfig(
                    output_dir=out,
                    per_device_train_batch_size=batch_size,
                    num_generations=8,
                    max_completion_length=response_length,
                    max_steps=updates,
                    learning_rate=1e-5,
                    lr_scheduler_type="constant",
                    num_iterations=1,
                    bf16=gpu,
                    use_cpu=not gpu,
                    logging_steps=1,
                    save_strategy="no",
                    report_to="none",
                    disable_tqdm=True,
                    gradient_checkpointing="gc" in options,
                    disable_dropout=True,
                    **optimizer_training_argument(cfg.optim),
                    **sampling,
                )
                trainer = GRPOTrainer(
                    model=policy,
                    reward_funcs=[reward],
                    args=grpo_args,
                    processing_class=tokenizer,
                    train_dataset=Dataset.from_dict({"prompt": prompts}),
                    callbacks=[Boundaries()],
                    peft_config=peft_config,
                )
            model, run = trainer.model, trainer.train
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        clock.update_done()
        run()
    clocks_at_end = gpu_clocks() if gpu else None
    if len(clock.stamps) != updates + 1:
        raise SystemExit(f"{row}: {len(clock.stamps) - 1} update boundaries seen, expected {updates}")
    start, end = clock.stamps[args.warmup], clock.stamps[args.warmup + args.updates]
    seconds, generate_seconds = end[0] - start[0], end[1] - start[1]
    steps, tokens = end[2] - start[2], end[3] - start[3]
    timed_phases = clock.phases[args.warmup : args.warmup + args.updates]
    phases = (
        {k: round(sum(p[k] for p in timed_phases) / len(timed_phases), 3) for k in timed_phases[0]}
        if timed_phases
        else None
    )
    # Tokens through one whole update, as the field counts them: each episode's prompt (its mean length) and its
    # sampled response tokens (up to and including the first eos).
    prompt_tokens = args.updates * batch_size * sum(map(len, prompts)) / len(prompts)
    timed_stamps = clock.stamps[args.warmup : args.warmup + args.updates + 1]

    def each_update(field: int) -> list:
        """A stamp field's change over each timed update."""
        return [b[field] - a[field] for a, b in zip(timed_stamps[:-1], timed_stamps[1:], strict=True)]

    allocator = (
        {
            k: clock.allocator[args.warmup + args.updates][k] - clock.allocator[args.warmup][k]
            for k in ALLOCATOR_COUNTERS
        }
        if clock.allocator
        else None
    )
    return {
        "row": row,
        "model": args.model,
        "batch_size": batch_size,
        "rows_per_pass": micro or "auto",
        "response_length": response_length,
        "updates": args.updates,
        "episodes_per_second": round(args.updates * batch_size / seconds, 2),
        "tokens_per_second": round((prompt_tokens + tokens) / seconds, 1),
        "generated_tokens_per_second": round(tokens / seconds, 1),
        "ms_per_decode_step": round(1000 * generate_seconds / steps, 2),
        "generate_share": round(generate_seconds / seconds, 3),
        "seconds_per_update": round(seconds / args.updates, 3),
        "warmup_seconds": round(clock.stamps[args.warmup][0] - clock.stamps[0][0], 2),
        "first_update_seconds": round(clock.stamps[1][0] - clock.stamps[0][0], 2),
        "graphs_compiled": end[4],
        "graphs_compiled_while_timed": end[4] - start[4],
        # the timed rows' peaks: the profiled update resets them, so with --profile they are read as it begins
        "peak_gpu_mb": (profiler.peaks_before[0] if profiler else round(torch.cuda.max_memory_allocated() / 2**20, 1))
        if gpu
        else None,
        "peak_gpu_reserved_mb": (
            profiler.peaks_before[1] if profiler else round(torch.cuda.max_memory_reserved() / 2**20, 1)
        )
        if gpu
        else None,
        "trainable_parameters": trainable,
        "optimizer_state_mb": round(optimizer_state_bytes(trainer.optimizer) / 2**20, 1),
        "versions": versions(),
        # the trainer's own phases (synchronised on a GPU): their sum should be the update's wall time
        "timing_phases_per_update": phases,
        "timing_phase_sum_share": round(sum(phases.values()) / (seconds / args.updates), 3) if phases else None,
        "seconds_each_update": [round(d, 3) for d in each_update(0)],
        "timing_phases_each_update": [{k: round(v, 3) for k, v in p.items()} for p in timed_phases],
        # Python's garbage collector within each timed update: its pauses (s) and how many collections were full
        "gc_seconds_each_update": [round(d, 3) for d in each_update(5)],
        "full_collections_each_update": each_update(6),
        "allocator_while_timed": allocator,
        "gpu_clocks": {"timed_start": clock.clocks_at_start, "end": clocks_at_end},
        **vllm_measures(trainer if name.startswith("trl-ext/vllm") else None, cfg, gpu),
        **({"profile": profiler.phases} if profiler is not None else {}),
    }


def vllm_measures(trainer, cfg, gpu: bool) -> dict:
    """A vLLM row's engine figures: start, syncs, the options it ran with, and the whole device's memory in use
    at the end (vLLM's KV cache and sleep-mode pools are not all counted by torch's allocator statistics)."""
    if trainer is None:
        return {}
    import torch

    found = {
        "vllm": {k: round(v, 3) if isinstance(v, float) else v for k, v in trainer.sampler.stats.items()},
        "vllm_gpu_memory_utilization": cfg.vllm_gpu_memory_utilization,
        "vllm_enable_sleep_mode": cfg.vllm_enable_sleep_mode,
    }
    if gpu:
        free, total = torch.cuda.mem_get_info()
        found["gpu_used_mb_at_end"] = round((total - free) / 2**20, 1)
    return found


def versions() -> dict:
    """The versions this row ran with (rows of one run may use different TRL releases)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "transformers", "trl", "peft", "accelerate", "vllm"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def environment(spec: str | None) -> tuple[str, dict]:
    """The Python and environment a row runs with: a virtual environment's own Python, or this Python
    with a ``pip install --target`` folder first on ``PYTHONPATH``; this repository is on it either way."""
    env = dict(os.environ)
    paths = [str(ROOT)]
    python = sys.executable
    if spec:
        folder = Path(spec).resolve()
        if (folder / "bin" / "python").exists():
            python = str(folder / "bin" / "python")
        elif folder.is_dir():
            paths.insert(0, str(folder))
        else:
            raise SystemExit(f"gpu.py: {spec} is neither a virtual environment nor a folder")
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    return python, env


def run_row(row: str, shape: str, args) -> tuple[dict | None, str | None]:
    """One row in a fresh process: ``(result, None)`` or ``(None, why it failed)``."""
    if row.startswith("trl-ppo"):
        spec = args.trl_ppo
    elif row.startswith("trl-ext/vllm"):
        spec = args.vllm_env or args.trl_latest
    else:
        spec = args.trl_latest
    python, env = environment(spec)
    cmd = (
        [
            python,
            str(Path(__file__).resolve()),
            "--one",
            row,
            "--shapes",
            shape,
            "--updates",
            str(args.updates),
            "--warmup",
            str(args.warmup),
            "--vllm-gpu-memory-utilization",
            str(args.vllm_gpu_memory_utilization),
            "--model",
            args.model,
        ]
        + (["--tiny"] if args.tiny else [])
        + (["--profile"] if args.profile else [])
    )
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.row_timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, f"no result within {args.row_timeout} s"
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :]), None
    lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    print("\n".join(f"  | {line[:300]}" for line in lines[-25:]), flush=True)  # the log keeps why
    return None, (lines[-1] if lines else f"exit code {done.returncode}")[:500]


def command() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])


def table(data: dict) -> str:
    """The results file as the markdown table docs/results.md shows (``NAME.md`` beside ``NAME.json``)."""
    lines = [
        "| row | policy | prompts x tokens | rows a pass | episodes/s | at the median update | tokens/s | "
        "ms a decode step | generating | s an update (generate / experience / update) | slowest update s | "
        "peak GPU MiB | graphs compiled while timed | first update s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        each = r.get("seconds_each_update")  # every timed update's seconds (files before it have the mean alone)
        median_rate = f"{r['batch_size'] / statistics.median(each):.1f}" if each else "-"
        slowest = f"{max(each):.2f}" if each else "-"
        tokens = format(r["tokens_per_second"], ",.0f") if "tokens_per_second" in r else "-"
        phases = r.get("timing_phases_per_update") or {}
        split = " / ".join(
            f"{phases[f'timing/{k}']:.2f}" for k in ("generate", "experience", "update") if f"timing/{k}" in phases
        )
        lines.append(
            f"| `{r['row']}` | {r.get('model', '0.5b')} | {r['batch_size']}x{r['response_length']} | "
            f"{r.get('rows_per_pass', 'auto')} | {r['episodes_per_second']:.1f} | "
            f"{median_rate} | {tokens} | "
            f"{r['ms_per_decode_step']:.1f} | {r['generate_share']:.0%} | "
            f"{r['seconds_per_update']:.2f}{f' ({split})' if split else ''} | {slowest} | "
            f"{r['peak_gpu_mb']:,.0f} | "
            f"{r['graphs_compiled_while_timed']} | {r['first_update_seconds']:.1f} |"
        )
    model = data.get("settings", {}).get("model", "0.5b")
    lines += [
        f"| `{f['row']}` | {model} | {f['shape']} | failed: {f['error']} |||||||||||" for f in data.get("failed", [])
    ]
    lines += [
        f"| `{f['row']}` | {model} | {f['shape']} | not run: {f['why']} |||||||||||" for f in data.get("not_run", [])
    ]
    return "\n".join(lines) + "\n"


def summary(results: list[dict]) -> str:
    """The rows as a short table (the end of a device run's output)."""
    keys = (
        "episodes_per_second",
        "ms_per_decode_step",
        "generate_share",
        "seconds_per_update",
        "warmup_seconds",
        "graphs_compiled_while_timed",
        "peak_gpu_mb",
    )
    lines = ["row shape " + " ".join(keys)]
    for r in results:
        lines.append(f"{r['row']} {r['batch_size']}x{r['response_length']} " + " ".join(str(r[k]) for k in keys))
        if r.get("profile"):
            lines.append(profile_summary(r["profile"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny models on any device: check the script only")
    parser.add_argument("--model", choices=MODELS, default="0.5b", help="the policy's shape (Qwen2.5)")
    parser.add_argument(
        "--deadline",
        type=float,
        default=0,
        help="seconds after which no further row starts (0: none); rows left are listed under not_run",
    )
    parser.add_argument("--shapes", default=",".join(SHAPES), help="prompts per update x response tokens")
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"some of {', '.join(ROWS)}")
    parser.add_argument(
        "--sampler",
        help="the scratch trainer's rows alone, by sampler (comma-separated: "
        "'vllm' is --rows trl-ext/vllm); results to rlhf-gpu-SAMPLERS.json unless --out",
    )
    parser.add_argument(
        "--vllm-env",
        help="virtual environment or --target folder with CUDA vLLM (the vLLM rows; default: --trl-latest)",
    )
    parser.add_argument(
        "--vllm-gpu-memory-utilization",
        type=float,
        default=0.3,
        help="share of GPU memory vLLM takes (PPOConfig's vllm_gpu_memory_utilization)",
    )
    parser.add_argument("--lora", action="store_true", help="also each row with LoRA (r 16, all linear layers)")
    parser.add_argument("--updates", type=int, default=5, help="timed updates per row")
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates first (compiling happens there)")
    parser.add_argument(
        "--profile", action="store_true", help="one more update after the timed ones, its phases profiled apart"
    )
    parser.add_argument("--trl-ppo", help="virtual environment or --target folder with TRL 1.12 (trl-ppo row)")
    parser.add_argument("--trl-latest", help="the same with the newest TRL (every other row)")
    parser.add_argument("--row-timeout", type=int, default=1200, help="seconds a row may take")
    parser.add_argument("--out", help="result file (default: benchmarks/results/rlhf-gpu.json)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a row, in the child process
    parser.add_argument("--table", help="only write the markdown table of this results file beside it")
    args = parser.parse_args(argv)
    if args.deadline < 0:
        parser.error(f"--deadline takes seconds, 0 or more (0: none); got {args.deadline:g}")
    if args.table:
        rewrite_table(Path(args.table), table)
        return 0
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [s for s in shapes if not re.fullmatch(r"[1-9]\d*x[1-9]\d*", s)]
    if bad or not shapes:
        parser.error(f"--shapes takes PROMPTSxTOKENS, comma-separated (16x64,64x128); got {args.shapes!r}")
    if args.one:
        batch_size, response_length = map(int, shapes[0].split("x"))
        print(RESULT + json.dumps(measure(args.one, batch_size, response_length, args)), flush=True)
        return 0
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if args.sampler:  # a run of some samplers must not overwrite the file of a full run
        samplers = [s.strip() for s in args.sampler.split(",") if s.strip()]
        rows = [f"trl-ext/{s}" for s in samplers]
        args.out = args.out or str(ROOT / "benchmarks" / "results" / f"rlhf-gpu-{'-'.join(samplers)}.json")
    args.out = args.out or str(ROOT / "benchmarks" / "results" / "rlhf-gpu.json")
    for row in rows:
        try:
            row_parts(row)
        except ValueError as err:
            parser.error(str(err))
    import torch

    if not torch.cuda.is_available() and not args.tiny:
        print("no GPU here: nothing measured, nothing written (use --tiny to check the script)")
        return 2
    rows += [r + "+lora" for r in rows] if args.lora else []
    from trl_ext.runs.machine import machine

    settings = {k: v for k, v in vars(args).items() if k not in ("one", "out")}
    results, failed, not_run = [], [], []
    began = time.monotonic()
    for shape in shapes:
        for row in rows:
            if args.deadline and time.monotonic() - began > args.deadline:
                not_run.append({"row": row, "shape": shape, "why": f"--deadline {args.deadline:g} s had passed"})
                print(f"{row} {shape}: not run (--deadline)", flush=True)
            else:
                result, why = run_row(row, shape, args)
                print(f"{row} {shape}: {result or 'FAILED ' + why}", flush=True)
                if result:
                    results.append(result)
                else:
                    failed.append({"row": row, "shape": shape, "error": why})
            if not args.tiny:  # after every row: a run cut short keeps what it measured
                data = {
                    "benchmark": "rlhf-gpu",
                    "machine": machine(),
                    "device": torch.cuda.get_device_name(),
                    "commands": [command()],
                    # the device machine gets a copy of the tree without git: the caller names the commit
                    "commit": os.environ.get("TRL_EXT_COMMIT") or git_commit(),
                    "settings": settings,
                    "rows": results,
                    "failed": failed,
                    "not_run": not_run,
                }
                write_results(Path(args.out), data, table)
    print(summary(results))
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
