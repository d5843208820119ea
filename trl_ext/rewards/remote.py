"""``RemoteReward(url)``: a reward function that scores through ``trl-ext serve-reward`` (or any server
that speaks ``trl_ext.rewards.protocol``), usable wherever a reward function is: the scratch trainer,
TRL's GRPO/RLOO ``reward_funcs``, TRL 1.12's PPO through ``trl_compat.reward_model``.

Retries: a lost connection, a timeout or a 5xx answer is tried again, with the wait doubling from
``backoff`` up to ``max_backoff`` seconds, until ``retry_window`` seconds have passed since the first
failure of that request; a 4xx answer or a malformed 200 is an error at once. Scoring is a pure
function of the request, so a retried request changes nothing: a training run whose server restarts
within the window ends with the weights it would have had.
"""

from __future__ import annotations

import json
import re
import time
from urllib.parse import urlsplit

from trl_ext.rewards.base import RewardError, RewardFunction, validate_rewards
from trl_ext.rewards.protocol import HEALTH_PATH, PROTOCOL_VERSION, SCORE_PATH, encode_request, per_row_columns


class RemoteRewardError(RewardError):
    """A reward server could not be reached, refused a request, or answered something that is not rewards."""


class RemoteReward(RewardFunction):
    """Score ``(prompts, completions, **columns)`` on the reward server at ``url`` (``http://host:port``).

    ``batch_size``: completions per request; ``timeout``: seconds to wait for one answer; retries as
    in the module docstring. ``requests`` / ``retries``: counts, for benchmarks and logs.
    """

    allow_none = True  # the server may answer null where its reward does not apply (GRPO's rule)

    def __init__(
        self,
        url: str,
        *,
        batch_size: int = 256,
        timeout: float = 120.0,
        retry_window: float = 60.0,
        backoff: float = 0.25,
        max_backoff: float = 4.0,
        name: str = "remote_reward",
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteRewardError(f"reward URL {url!r} is not an http:// or https:// address")
        if batch_size <= 0 or timeout <= 0 or retry_window < 0 or backoff <= 0:
            raise RemoteRewardError("batch_size and timeout must be positive, retry_window not negative")
        self.url = url.rstrip("/")
        self.batch_size, self.timeout, self.retry_window = batch_size, timeout, retry_window
        self.backoff, self.max_backoff, self.name = backoff, max_backoff, name
        self.requests = self.retries = 0
        self._session = None

    def __getstate__(self):  # a Session holds sockets: each process opens its own
        return {**self.__dict__, "_session": None}

    @property
    def session(self):
        import requests

        if self._session is None:
            self._session = requests.Session()
        return self._session

    def check(self) -> dict:
        """One ``GET /health``, no retries: the server's description, or an error naming the URL."""
        import requests

        try:
            answer = self.session.get(self.url + HEALTH_PATH, timeout=min(self.timeout, 10.0))
            health = answer.json() if answer.status_code == 200 else None
        except (requests.RequestException, ValueError) as err:
            raise RemoteRewardError(f"reward server {self.url} is not reachable: {_reason(err)}") from None
        if not isinstance(health, dict) or health.get("protocol") != PROTOCOL_VERSION:
            raise RemoteRewardError(
                f"reward server {self.url} did not answer {HEALTH_PATH} as trl-ext serve-reward "
                f"(protocol {PROTOCOL_VERSION}) does: HTTP {answer.status_code}"
            )
        return health

    def score(self, prompts, completions, **columns):
        columns = per_row_columns(columns, len(prompts))
        rewards = []
        for start in range(0, len(prompts), self.batch_size):
            rows = slice(start, start + self.batch_size)
            body = encode_request(prompts[rows], completions[rows], {k: v[rows] for k, v in columns.items()})
            rewards.extend(self._post(body, len(prompts[rows])))
        return rewards

    def _post(self, body: bytes, rows: int) -> list:
        """One batch's rewards, retried as the module docstring says."""
        import requests

        first_failure, wait, attempt = None, self.backoff, 0
        while True:
            attempt += 1
            self.requests += 1
            try:
                answer = self.session.post(
                    self.url + SCORE_PATH, data=body, timeout=self.timeout, headers={"Content-Type": "application/json"}
                )
            except requests.RequestException as err:  # refused, reset, timed out: the server may come back
                failure = _reason(err)
            else:
                if answer.status_code == 200:
                    return self._rewards(answer, rows)
                failure = f"HTTP {answer.status_code}: {_error_text(answer)}"
                if answer.status_code < 500:
                    raise RemoteRewardError(f"reward server {self.url} refused the request ({failure})")
            now = time.monotonic()
            first_failure = first_failure if first_failure is not None else now
            if now + wait - first_failure > self.retry_window:
                raise RemoteRewardError(
                    f"reward server {self.url}: no answer after {attempt} attempt(s) over "
                    f"{now - first_failure:.1f} s; last failure: {failure}"
                )
            self.retries += 1
            time.sleep(wait)
            wait = min(wait * 2, self.max_backoff)

    def _rewards(self, answer, rows: int) -> list:
        try:
            values = json.loads(answer.content.decode("utf-8")).get("rewards")
        except (UnicodeDecodeError, ValueError, AttributeError):
            raise RemoteRewardError(
                f'reward server {self.url} answered something that is not {{"rewards": [...]}}: {answer.content[:80]!r}'
            ) from None
        try:
            return validate_rewards(self.__name__, values, rows, allow_none=True)
        except RewardError as err:
            raise RemoteRewardError(f"reward server {self.url}: {err}") from None


def _reason(err: Exception) -> str:
    """A ``requests`` error in one short line: the OS's reason where there is one (``[Errno 111] Connection
    refused``), not urllib3's nested retry message."""
    import requests

    text = str(err).strip()
    found = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    if found:
        return found.group(0).strip()
    if isinstance(err, requests.Timeout):
        return "timed out"
    name = type(err).__name__
    return f"{name}: {text.splitlines()[0][:200]}" if text else name


def _error_text(answer) -> str:
    try:
        return str(answer.json().get("error", ""))[:200] or answer.reason
    except (ValueError, AttributeError):
        return answer.text.strip().splitlines()[0][:200] if answer.text.strip() else str(answer.reason)
