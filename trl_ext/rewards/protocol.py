"""The JSON protocol between ``trl-ext serve-reward`` (``server.py``) and ``RemoteReward`` (``remote.py``).

``GET /health`` -> 200 ``{"status": "ok", "reward": NAME, "protocol": 1, "max_batch": N,
"max_request_bytes": B}``.

``POST /score`` with ``{"prompts": [...], "completions": [...], "columns": {NAME: [...], ...}}``:
one prompt and one completion per row, as TRL's GRPO hands them to a reward function (text, or
lists of ``{"role", "content"}`` messages), and the dataset's other columns, one value per row
(``label``, ``solution``, ``completion_ids``, ...). The answer, 200 ``{"rewards": [...]}``: one
float, or ``null`` where the reward does not apply, per completion, in order.

Errors: a JSON body ``{"error": "one line"}`` with status 400 (malformed request), 404/405 (no
such endpoint), 411 (no Content-Length), 413 (body over ``max_request_bytes`` or more rows than
``max_batch``), 422 (the reward refused its input: it raised a ``ValueError`` such as ``RewardError``,
a ``TypeError``, ``KeyError`` or ``IndexError``), 500 (it raised anything else), 503 (too many requests waiting).
Clients retry 5xx and lost connections, never 4xx: scoring is a pure function of the request, so a retried request gives
the same answer.
"""

from __future__ import annotations

import json

from trl_ext.rewards.base import RewardError

PROTOCOL_VERSION = 1
HEALTH_PATH = "/health"
SCORE_PATH = "/score"


def per_row_columns(columns: dict, rows: int) -> dict:
    """The keyword arguments a reward function got that are dataset columns: one value per row.

    What GRPO passes besides them (``trainer_state``, ``log_metric``, ``log_extra``) stays local.
    """
    return {k: list(v) for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) == rows}


def encode_request(prompts: list, completions: list, columns: dict) -> bytes:
    try:
        return json.dumps(
            {"prompts": prompts, "completions": completions, "columns": columns}, ensure_ascii=False, allow_nan=False
        ).encode("utf-8")
    except (TypeError, ValueError) as err:
        raise RewardError(f"a score request must be JSON: {err}") from None


def decode_request(body: bytes) -> tuple[list, list, dict]:
    """A score request's ``(prompts, completions, columns)``; ``RewardError`` naming what is wrong."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RewardError(f"the request body is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise RewardError("the request body must be an object with 'prompts' and 'completions'")
    unknown = sorted(set(data) - {"prompts", "completions", "columns"})
    if unknown:
        raise RewardError(f"unknown request field(s) {unknown}: expected 'prompts', 'completions', 'columns'")
    prompts, completions, columns = data.get("prompts"), data.get("completions"), data.get("columns", {})
    if not isinstance(prompts, list) or not isinstance(completions, list):
        raise RewardError("'prompts' and 'completions' must be lists")
    if len(prompts) != len(completions):
        raise RewardError(f"{len(prompts)} prompts but {len(completions)} completions")
    if not prompts:
        raise RewardError("the request holds no completions")
    for index, item in enumerate(prompts + completions):
        if not isinstance(item, (str, list)):
            raise RewardError(
                f"prompts and completions must be strings or message lists; "
                f"got a {type(item).__name__} at index {index % len(prompts)}"
            )
    if not isinstance(columns, dict):
        raise RewardError("'columns' must be an object of column name -> one value per row")
    for name, values in columns.items():
        if not isinstance(values, list) or len(values) != len(prompts):
            raise RewardError(f"column {name!r} must be a list of {len(prompts)} values")
    return prompts, completions, columns


def encode_json(data: dict) -> bytes:
    return json.dumps(data, ensure_ascii=False).encode("utf-8")
