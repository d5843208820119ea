"""Rewards over the network: ``RewardServer`` / ``trl-ext serve-reward`` and ``RemoteReward``, on loopback.

Every server here listens on a free port, is stopped by the test that started it, and every wait is bounded.
"""

import math
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from trl_ext.rewards import RemoteReward, RemoteRewardError, RewardError
from trl_ext.rewards.server import RewardServer
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config
from trl_ext.tasks.doubling.rewards import ExactMatch

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
PROMPTS = ["S数字:3320x2="] * 3 + ["S大写:3164x2="]
COMPLETIONS = ["6640E", "6641E", "x", "陆叁贰捌E"]


def test_scores_equal_local_batched_and_only_columns_travel():
    seen = []

    def spy(prompts, completions, **columns):
        seen.append(sorted(columns))
        return ExactMatch()(prompts, completions, **columns)

    with RewardServer(spy) as server:
        remote = RemoteReward(server.url, batch_size=3)
        assert remote.check()["reward"] == "spy"
        got = remote(PROMPTS, COMPLETIONS, label=[0, 0, 0, 2], trainer_state=object(), log_metric=print)
        assert got == ExactMatch()(PROMPTS, COMPLETIONS) == [1.0, 0.0, 0.0, 1.0]
        assert remote.requests == 2 and remote.retries == 0  # 4 rows in batches of 3
        assert seen == [["label"], ["label"]]  # GRPO's trainer_state / log_metric stay in the trainer


def test_bad_requests_get_one_line_and_the_server_keeps_serving():
    def picky(prompts, completions, **columns):
        if "label" not in columns:
            raise RewardError("reward 'picky' needs the dataset column 'label'")
        return [1.0] * len(prompts)

    with RewardServer(picky, max_batch=4, max_request_bytes=2000) as server:
        score = server.url + "/score"
        answer = requests.post(score, data=b"{not json", timeout=10)
        assert answer.status_code == 400 and "not JSON" in answer.json()["error"]
        answer = requests.post(score, json={"prompts": ["a"], "completions": []}, timeout=10)
        assert answer.status_code == 400 and answer.json()["error"] == "1 prompts but 0 completions"
        answer = requests.post(score, json={"prompts": ["a"] * 5, "completions": ["b"] * 5}, timeout=10)
        assert answer.status_code == 413 and "at most 4" in answer.json()["error"]
        answer = requests.post(score, data=b"x" * 3000, timeout=10)
        assert answer.status_code == 413 and "over this server's limit of 2000" in answer.json()["error"]
        assert requests.get(server.url + "/nothing", timeout=10).status_code == 404
        # the reward refuses its input: 422, and the client does not retry a 4xx
        remote = RemoteReward(server.url)
        with pytest.raises(
            RemoteRewardError,
            match=r"refused the request \(HTTP 422: RewardError: reward 'picky' "
            r"needs the dataset column 'label'\)",
        ):
            remote(["a"], ["b"])
        assert remote.requests == 1
        assert remote(["a"], ["b"], label=[0]) == [1.0]  # still serving
        assert server.counts == {"scored": 1, "errors": 6}


def test_5xx_is_retried_and_a_lost_server_ends_in_one_line_naming_url():
    calls = []

    def flaky(prompts, completions, **columns):
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("CUDA out of memory\nsecond line")
        return [0.5] * len(prompts)

    with RewardServer(flaky) as server:
        remote = RemoteReward(server.url, backoff=0.01)
        assert remote(["a", "b"], ["c", "d"]) == [0.5, 0.5]
        assert (remote.requests, remote.retries) == (3, 2)
    remote = RemoteReward(server.url, backoff=0.05, retry_window=0.5)  # nobody listens there any more
    with pytest.raises(RemoteRewardError) as caught:
        remote(["a"], ["b"])
    message = str(caught.value)
    assert message.startswith(f"reward server {server.url}: no answer after ") and "\n" not in message
    assert "Connection refused" in message and remote.retries >= 2
    with pytest.raises(RemoteRewardError, match=f"reward server {server.url} is not reachable"):
        RemoteReward(server.url).check()
    with pytest.raises(RemoteRewardError, match="not an http"):
        RemoteReward("localhost:8000")


class _Liar(BaseHTTPRequestHandler):
    """A server that answers 200 with whatever ``body`` says (NaN, the wrong length, garbage)."""

    body = b""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def do_GET(self):  # noqa: N802 - a health answer from another protocol
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def _liar(body: bytes):
    handler = type("Liar", (_Liar,), {"body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize(
    "body, message",
    [
        (b'{"rewards": [1.0, NaN]}', r"returned nan at index 1"),
        (b'{"rewards": [1.0]}', r"returned 1 values for 2 completions"),
        (b"<html>oops</html>", r"answered something that is not"),
        (b'{"rewards": ["1"]}', r"returned 1 values|non-number"),
    ],
)
def test_a_server_answering_nonsense_is_one_line_and_not_retried(body, message):
    server, url = _liar(body)
    try:
        remote = RemoteReward(url)
        with pytest.raises(RemoteRewardError, match=message) as caught:
            remote(["a", "b"], ["c", "d"])
        assert url in str(caught.value) and "\n" not in str(caught.value) and remote.requests == 1
        with pytest.raises(RemoteRewardError, match="did not answer /health as trl-ext serve-reward"):
            remote.check()
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------- PPO end to end

PPO_OPTIONS = dict(batch_size=16, num_mini_batches=2, total_episodes=48, num_ppo_epochs=1, seed=3)


def _train(artifacts, reward, callback=None):
    from trl_ext.ppo.trainer import PPOTrainer
    from trl_ext.tasks.doubling.artifacts import load_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    policy, tok = load_policy(artifacts["policy"])
    cfg = doubling_ppo_config(skip_special_tokens=False, separate_critic=True, **PPO_OPTIONS)
    trainer = PPOTrainer(
        policy, reward, args=cfg, train_dataset=ppo_prompt_dataset(tok, cfg.total_episodes, 3), processing_class=tok
    )
    history = trainer.train(callback)
    weights = {n: p.detach().clone() for n, p in trainer.actor_critic.named_parameters()}
    return weights, [h["objective/scores"] for h in history]


def _classifier(artifacts):
    from trl_ext.tasks.doubling.rewards import load_doubling_reward

    return load_doubling_reward(str(artifacts["reward"]))


@pytest.fixture(scope="module")
def local_run(trained_artifacts):
    return _train(trained_artifacts, _classifier(trained_artifacts))


def _assert_same(run, reference):
    weights, scores = run
    assert scores == reference[1]  # every update scored once, with the same numbers
    assert max(float((weights[n] - w).abs().max()) for n, w in reference[0].items()) <= 1e-6


def test_same_weights_with_the_reward_local_and_remote(trained_artifacts):
    # Several requests of 5 per update. The local reference scores in the same batches of 5: a batch's
    # padding and GEMM shapes change a classifier's logits in the last bit on some CPUs, and Adam makes
    # that 1e-5 in the weights, which would say nothing about the transport.
    local = _classifier(trained_artifacts)
    local.batch_size = 5
    reference = _train(trained_artifacts, local)
    with RewardServer(_classifier(trained_artifacts)) as server:
        remote = RemoteReward(server.url, batch_size=5)
        _assert_same(_train(trained_artifacts, remote), reference)
    assert remote.retries == 0 and remote.requests == 3 * 4


def _serve(reward_dir, port: int):
    """``trl-ext serve-reward`` in a child process; returns it with the address it printed (60 s at most)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trl_ext.commands.cli",
            "serve-reward",
            "--reward",
            str(reward_dir),
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    line = ""
    while time.monotonic() < deadline and "ready at" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(f"serve-reward exited {proc.returncode}: {proc.stderr.read()}")
    assert "ready at" in line, line
    return proc, line.rsplit(" ", 1)[-1].strip()


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_server_killed_and_restarted_mid_run_changes_nothing(trained_artifacts, local_run):
    first, url = _serve(trained_artifacts["reward"], 0)
    servers = [first]
    port = int(url.rsplit(":", 1)[1])
    remote = RemoteReward(url, backoff=0.2, retry_window=90)

    def kill_after_first_update(update, stats):
        if update == 1:
            first.kill()  # SIGKILL: no goodbye; the next update's request finds nobody there
            first.wait(timeout=20)
            threading.Thread(
                target=lambda: servers.append(_serve(trained_artifacts["reward"], port)[0]), daemon=True
            ).start()

    try:
        run = _train(trained_artifacts, remote, kill_after_first_update)
    finally:
        time.sleep(0.1)
        for proc in servers:
            _stop(proc)
    assert remote.retries > 0 and len(servers) == 2
    _assert_same(run, local_run)
    stopped = servers[1]
    assert stopped.returncode == 0 and "serve-reward: stopped (" in stopped.stdout.read()


# ---------------------------------------------------------------------------------------- command line


def _cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "trl_ext.commands.cli", *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=timeout,
    )


def _one_error_line(run, text: str):
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if "error" in line.lower()]  # not transformers' progress bars
    assert len(errors) == 1 and errors[0].startswith("trl-ext: error: ") and text in errors[0], run.stderr
    assert "Traceback" not in run.stderr


def test_command_line_errors_are_one_line(trained_artifacts, tmp_path):
    with RewardServer(ExactMatch()) as taken:
        port = taken.server_address[1]
        _one_error_line(
            _cli("serve-reward", "--reward-fn", "trl_ext.tasks.doubling.rewards:ExactMatch", "--port", str(port)),
            f"port {port} on 127.0.0.1 is in use",
        )
    _one_error_line(_cli("serve-reward", "--reward", str(tmp_path / "nothing")), "nothing")
    _one_error_line(_cli("serve-reward", "--reward-fn", "no_such_module:f"), "cannot import 'no_such_module'")
    out = tmp_path / "run"
    # nobody listens on the port `taken` had: one line before anything is trained or written
    _one_error_line(
        _cli(
            "ppo",
            "--policy",
            str(trained_artifacts["policy"]),
            "--reward-url",
            f"http://127.0.0.1:{port}",
            "--out",
            str(out),
        ),
        f"reward server http://127.0.0.1:{port} is not reachable: [Errno 111] Connection refused",
    )
    assert not out.exists()


def test_ppo_against_a_server_answering_nan_writes_no_model(trained_artifacts, tmp_path):
    class NaNAfterHealth(ExactMatch):
        def score(self, prompts, completions, **columns):
            return [float("nan")] * len(prompts)

    with RewardServer(NaNAfterHealth()) as server:
        out = tmp_path / "run"
        run = _cli(
            "ppo",
            "--policy",
            str(trained_artifacts["policy"]),
            "--reward-url",
            server.url,
            "--out",
            str(out),
            "--total-episodes",
            "16",
            "--batch-size",
            "16",
            "--probe-every",
            "0",
            "--eval-n",
            "10",
        )
    # the server refuses its own reward's NaN (422): the run stops at its first update, no weights written
    _one_error_line(
        run,
        f"reward server {server.url} refused the request (HTTP 422: RewardError: reward "
        "'doubling_exact' returned nan at index 0)",
    )
    assert not list(out.glob("*.safetensors")) and not (out / "summary.json").exists()


@pytest.mark.needs_trl_ppo
def test_remote_reward_through_trl_ppo_reward_model_adapter(trained_artifacts, tokenizer):
    from test_rewards import _reward_through_trl

    from trl_ext.tasks.doubling.task import Sample, prompt_dataset

    dataset = prompt_dataset(tokenizer, [Sample(3320, 0, True)] * 3 + [Sample(3164, 2, True)])
    local = _classifier(trained_artifacts)
    with RewardServer(local) as server:
        via_trl = _reward_through_trl(RemoteReward(server.url), tokenizer, dataset, COMPLETIONS)
    assert via_trl == pytest.approx(local(dataset["prompt"], COMPLETIONS), abs=1e-5)


@pytest.mark.trl_api  # TRL's GRPOTrainer
def test_remote_reward_as_a_grpo_reward_func(trained_artifacts, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    from trl_ext.tasks.doubling.artifacts import load_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    policy, tok = load_policy(trained_artifacts["policy"])
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    data = ppo_prompt_dataset(tok, 8, seed=0).select_columns(["prompt", "label"])
    with RewardServer(_classifier(trained_artifacts)) as server:
        remote = RemoteReward(server.url)
        trainer = GRPOTrainer(model=policy, reward_funcs=[remote], args=args, train_dataset=data, processing_class=tok)
        trainer.train()
        assert server.counts["scored"] == 4 and remote.retries == 0
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert logged and all(math.isfinite(r) for r in logged)
