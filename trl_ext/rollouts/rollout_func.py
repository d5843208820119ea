"""TRL's ``rollout_func`` as a rollout: ``rollout_func(prompts, trainer)`` gets each prompt once (the batch holds
``num_generations`` rows a prompt) and returns ``prompt_ids``, ``completion_ids``, ``logprobs`` for every
completion, optionally ``env_mask`` (1 on the model's tokens); its other keys go to the reward functions."""

from __future__ import annotations

from collections.abc import Callable

from trl_ext.agents import templates
from trl_ext.agents.trajectory import Trajectory
from trl_ext.data.sequences import is_conversation
from trl_ext.errors import InputError
from trl_ext.rollouts.base import Rollout, Sampling
from trl_ext.rollouts.record import RolloutBatch
from trl_ext.rollouts.tool_loop import check_multi_turn
from trl_ext.rollouts.trajectories import trajectories_record

ROLLOUT_FUNC_KEYS = ("prompt_ids", "completion_ids", "logprobs")


class RolloutFunction(Rollout):
    """A user's ``rollout_func`` (TRL's contract) makes the whole rollout."""

    def __init__(self, rollout_func: Callable):
        if not callable(rollout_func):
            raise InputError(f"rollout_func must be callable, got {type(rollout_func).__name__}")
        self.rollout_func = rollout_func

    def check(self, config, tokenizer) -> None:
        check_multi_turn(config)

    def rollout(self, rows: dict, sampling: Sampling) -> RolloutBatch:
        tokenizer = sampling.tokenizer
        prompts = rows.get("prompt") or tokenizer.batch_decode(rows["input_ids"])
        groups = sampling.config.num_generations
        output = self.rollout_func(prompts[::groups], sampling.trainer)
        trajectories = self._trajectories(output, prompts, groups, tokenizer)
        columns = {k: v for k, v in output.items() if k not in (*ROLLOUT_FUNC_KEYS, "env_mask")}
        return trajectories_record(trajectories, prompts, tokenizer.pad_token_id, sampling.device, columns=columns)

    @staticmethod
    def _trajectories(output, prompts: list, groups: int, tokenizer) -> list[Trajectory]:
        if not isinstance(output, dict) or any(k not in output for k in ROLLOUT_FUNC_KEYS):
            got = sorted(output) if isinstance(output, dict) else type(output).__name__
            raise InputError(
                f"rollout_func must return a dict with keys {', '.join(ROLLOUT_FUNC_KEYS)} (and maybe "
                f"env_mask); got {got}"
            )
        count = len(prompts)
        env_mask = output.get("env_mask")
        for key in (*ROLLOUT_FUNC_KEYS, "env_mask"):
            values = output.get(key)
            if values is not None and len(values) != count:
                raise InputError(
                    f"rollout_func returned {len(values)} {key} for {count} completions "
                    f"({count // groups} prompts x num_generations {groups})"
                )
        trajectories = []
        for i in range(count):
            ids = list(output["completion_ids"][i])
            mask = [1] * len(ids) if env_mask is None else [int(m) for m in env_mask[i]]
            logprobs = (
                None
                if output["logprobs"] is None or output["logprobs"][i] is None
                else [float(x) for x in output["logprobs"][i]]
            )
            if len(mask) != len(ids) or (logprobs is not None and len(logprobs) != len(ids)):
                raise InputError(
                    f"rollout_func completion {i}: {len(ids)} completion_ids but {len(mask)} env_mask "
                    "values or a different number of logprobs"
                )
            if not any(mask):
                raise InputError(f"rollout_func completion {i} has no model token (env_mask all 0)")
            t = Trajectory(list(output["prompt_ids"][i]), ids, mask, logprobs)
            t.model_turns = sum(1 for k, m in enumerate(mask) if m and (k == 0 or not mask[k - 1]))  # runs of 1s
            t.messages = decoded(tokenizer, ids, t.prompt_ids, prompts[i])
            trajectories.append(t)
        return trajectories


def decoded(tokenizer, ids: list[int], prefix: list[int], prompt):
    """A completion as TRL hands it to reward functions: text, or one assistant message (parsed where the
    tokenizer has a response parser)."""
    if not is_conversation(prompt):
        return tokenizer.decode(ids, skip_special_tokens=True)
    if getattr(tokenizer, "response_template", None) is not None:
        return [templates.parse_turn(tokenizer, ids, prefix, [])[0]]
    return [{"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}]
