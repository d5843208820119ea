"""A vLLM server on this machine, started as docs/vllm.md starts one for ``vllm_mode="server"`` (its own process
group, development mode, token ids, log-probs after temperature): for tests, benchmarks, and a user who wants the
server beside the trainer on cores of its own (``cores``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from trl_ext.errors import RolloutEngineError

SERVER_ENV = {
    "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc, /pause, /resume, /weight_info: the weight sync's endpoints
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the worker inside the engine process: one import of vLLM fewer (8 s)
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model_dir: str | Path, port: int, dtype: str = "auto", max_model_len: int = 2048) -> list[str]:
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len),
        "--skip-tokenizer-init", "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs",
        "--enforce-eager", "--distributed-executor-backend", "uni",
    ]  # fmt: skip


class LocalServer:
    """Started on construction, ready when it returns (``/health`` answers), stopped by ``stop()`` (the engine
    process with it). ``cores``: CPU cores to pin it to (``taskset``), one torch thread each."""

    def __init__(
        self,
        model_dir: str | Path,
        log_path: str | Path,
        dtype: str = "auto",
        cores: list[int] | None = None,
        max_model_len: int = 2048,
        start_timeout: float = 600.0,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, **SERVER_ENV, OMP_NUM_THREADS=str(len(cores) if cores else 1))
        command = server_command(model_dir, self.port, dtype, max_model_len)
        if cores:
            command = ["taskset", "-c", ",".join(map(str, cores)), *command]
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            command, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        start = time.monotonic()
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() - start > start_timeout:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RolloutEngineError(f"the vLLM server did not start (log {self.log_path}):\n{tail}")
            time.sleep(0.3)
        self.start_seconds = time.monotonic() - start

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        # the whole group, even when the API server already exited: its engine process may outlive it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self._log.close()

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
