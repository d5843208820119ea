"""``trl-ext serve-reward``: one reward object (classifier or reward model directories, ``module:callable``
functions, weighted) served over HTTP until Ctrl-C or SIGTERM; ``--reward-url`` on ``ppo``, ``rlhf`` and
``compare`` scores through it. The protocol: ``trl_ext.rewards.protocol``."""

from __future__ import annotations

from dataclasses import dataclass

from trl_ext.commands.parsing import Command, CommandResult
from trl_ext.errors import InputError
from trl_ext.settings.fields import field


def _names(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


@dataclass
class ServeOptions:
    reward: str | None = field(
        None,
        help="classifier or scalar reward model directories, comma-separated (a "
        "4-label doubling charset classifier scores the requested set)",
    )
    reward_fn: str | None = field(
        None, help="reward functions as 'module:callable' or 'file.py:callable', comma-separated"
    )
    weights: str | None = field(
        None,
        help="one weight per reward, comma-separated, --reward ones first "
        "(default: all 1; rows where every reward is None are an error)",
    )
    host: str = field("127.0.0.1", help="address to listen on (loopback by default; 0.0.0.0 opens it to the network)")
    port: int = field(8000, help="port to listen on (0: a free one; the address is printed when ready)")
    device: str = field("auto", help="where a model reward runs: auto (a GPU if there is one), cpu, cuda, cuda:1 ...")
    max_batch: int = field(4096, help="completions one request may hold (more: HTTP 413)")
    max_request_bytes: int = field(64 << 20, help="largest request body (more: HTTP 413, unread)")
    max_concurrency: int = field(
        1,
        help="reward calls at once (1: a model reward and its tokenizer are not "
        "thread-safe; raise it for thread-safe functions)",
    )
    max_pending: int = field(64, help="requests waiting or running at once (more: HTTP 503, the client backs off)")

    def __post_init__(self):
        if not _names(self.reward) and not _names(self.reward_fn):
            raise InputError("give --reward (model directories) and/or --reward-fn (module:callable)")
        count = len(_names(self.reward)) + len(_names(self.reward_fn))
        if self.weights is not None and len(_names(self.weights)) != count:
            raise InputError(f"--weights has {len(_names(self.weights))} values for {count} rewards")
        if not 0 <= self.port <= 65535:
            raise InputError(f"port must be in 0..65535, got {self.port}")


def build_reward(opts: ServeOptions):
    """The served object: the one reward, or the weighted sum of several (GRPO's rule for None)."""
    from trl_ext.rewards.base import import_reward_function, place_reward
    from trl_ext.rewards.loading import summed
    from trl_ext.tasks.doubling.rewards import load_doubling_reward

    rewards = [load_doubling_reward(path) for path in _names(opts.reward)]
    rewards += [import_reward_function(spec) for spec in _names(opts.reward_fn)]
    weights = None
    if opts.weights is not None:
        try:
            weights = [float(w) for w in _names(opts.weights)]
        except ValueError:
            raise InputError(f"--weights {opts.weights!r}: expected numbers separated by commas") from None
    reward = summed(rewards, weights)
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if opts.device == "auto" else opts.device
    for fn in rewards:
        place_reward(fn, _device(device))
    return reward


def _device(name: str):
    """``--device`` as a torch device this machine has."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"--device {name!r} is not a device: give auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise InputError(f"--device {name!r}: this machine has {torch.cuda.device_count()} CUDA devices")
    return device


def serve_reward(opts, print_fn=print) -> CommandResult:
    import signal

    from trl_ext.rewards.server import RewardServer

    serve = opts.serve
    reward = build_reward(serve)
    server = RewardServer(
        reward,
        serve.host,
        serve.port,
        max_batch=serve.max_batch,
        max_request_bytes=serve.max_request_bytes,
        max_concurrency=serve.max_concurrency,
        max_pending=serve.max_pending,
    )

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print_fn(f"serve-reward: {server.health()['reward']} ready at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    counts = server.counts
    return CommandResult(
        f"serve-reward: stopped ({counts['scored']} completions scored, {counts['errors']} error answers)", counts
    )


COMMAND = Command(
    help="serve a reward (classifier, reward model, module:callable, weighted) over HTTP",
    parts={"serve": ServeOptions},
    run=serve_reward,
)
