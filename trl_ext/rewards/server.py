"""Serve any reward function over HTTP (the protocol of ``trl_ext.rewards.protocol``).

The standard library's ``ThreadingHTTPServer`` (a thread per connection, HTTP/1.1 keep-alive),
bounded three ways: a request body over ``max_request_bytes`` is refused before it is read, at
most ``max_concurrency`` reward calls run at once (default 1: a model and its fast tokenizer are
not safe to call from several threads), and at most ``max_pending`` requests wait for a turn (the
others get 503 at once and the client backs off). ``benchmarks/remote_reward.py`` measures it.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from trl_ext.rewards.base import RewardError, call_reward, reward_name
from trl_ext.rewards.protocol import HEALTH_PATH, PROTOCOL_VERSION, SCORE_PATH, decode_request, encode_json

# What a reward raises for input it cannot score (RewardError is a ValueError): the same request fails
# again, so the answer is 422 and the client does not retry. Anything else (a RuntimeError such as
# CUDA out of memory, an OSError) may pass: 500, retried.
INPUT_ERRORS = (ValueError, TypeError, KeyError, IndexError)


def one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per client, not one per request
    timeout = 120  # seconds an idle keep-alive connection may hold its thread
    server: RewardServer

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # the server counts requests; a line per request would flood a training log

    def _answer(self, status: int, data: dict, close: bool = False) -> None:
        body = encode_json(data)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, close: bool = False) -> None:
        self.server.count("errors")
        self._answer(status, {"error": message}, close)

    def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler's name
        if self.path.rstrip("/") != HEALTH_PATH:
            return self._error(HTTPStatus.NOT_FOUND, f"no endpoint {self.path!r}: GET {HEALTH_PATH}, POST {SCORE_PATH}")
        self._answer(HTTPStatus.OK, self.server.health())

    def do_POST(self):  # noqa: N802
        server = self.server
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            return self._error(HTTPStatus.LENGTH_REQUIRED, "a score request needs a Content-Length", close=True)
        if int(length) > server.max_request_bytes:  # refused unread: the connection cannot be reused
            return self._error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"request body of {length} bytes is over this server's limit of {server.max_request_bytes}",
                close=True,
            )
        body = self.rfile.read(int(length))
        if self.path.rstrip("/") != SCORE_PATH:
            return self._error(HTTPStatus.NOT_FOUND, f"no endpoint {self.path!r}: POST {SCORE_PATH}")
        try:
            prompts, completions, columns = decode_request(body)
        except RewardError as err:
            return self._error(HTTPStatus.BAD_REQUEST, str(err))
        if len(prompts) > server.max_batch:
            return self._error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{len(prompts)} completions in one request; this server takes at most {server.max_batch}",
            )
        if not server.waiting.acquire(blocking=False):
            return self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"busy: {server.max_pending} requests already wait")
        try:
            with server.running:
                rewards = call_reward(server.reward_fn, prompts, completions, allow_none=True, **columns)
        except INPUT_ERRORS as err:  # the reward refused this input: retrying cannot help
            return self._error(HTTPStatus.UNPROCESSABLE_ENTITY, one_line(err))
        except Exception as err:  # noqa: BLE001 - any other failure may pass (a lost GPU, a sandbox timeout)
            return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, one_line(err))
        finally:
            server.waiting.release()
        server.count("scored", len(rewards))
        self._answer(HTTPStatus.OK, {"rewards": rewards})


class RewardServer(ThreadingHTTPServer):
    """``RewardServer(fn, port=0).url`` is where it listens (port 0: a free one); ``serve_forever()``
    blocks, ``start()`` serves from a daemon thread, ``close()`` stops either."""

    daemon_threads = True
    request_queue_size = 128  # connections the kernel holds before accept(): many clients at once

    def __init__(
        self,
        reward_fn: Callable,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_batch: int = 4096,
        max_request_bytes: int = 64 << 20,
        max_concurrency: int = 1,
        max_pending: int = 64,
    ):
        if not callable(reward_fn):
            raise RewardError(f"a reward server needs a callable reward, got {type(reward_fn).__name__}")
        for name, value in (
            ("max_batch", max_batch),
            ("max_request_bytes", max_request_bytes),
            ("max_concurrency", max_concurrency),
            ("max_pending", max_pending),
        ):
            if value <= 0:
                raise RewardError(f"{name} must be positive, got {value}")
        self.reward_fn, self.max_batch, self.max_request_bytes = reward_fn, max_batch, max_request_bytes
        self.max_pending = max_pending
        self.running = threading.Semaphore(max_concurrency)
        self.waiting = threading.BoundedSemaphore(max_pending)
        self.counts = {"scored": 0, "errors": 0}
        self._lock, self._thread = threading.Lock(), None
        try:
            super().__init__((host, port), _Handler)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise RewardError(f"port {port} on {host} is in use") from None
            raise RewardError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def health(self) -> dict:
        return {
            "status": "ok",
            "reward": reward_name(self.reward_fn),
            "protocol": PROTOCOL_VERSION,
            "max_batch": self.max_batch,
            "max_request_bytes": self.max_request_bytes,
            **self.counts,
        }

    def start(self) -> RewardServer:
        self._thread = threading.Thread(target=self.serve_forever, name=f"reward-server {self.url}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
            self._thread = None
        self.server_close()

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
