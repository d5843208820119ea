"""Multi-turn training with tools and environments: the rollout and scoring phases of one PPO update when the
trainer was given ``tools``, an ``environment_factory`` or a ``rollout_func`` (TRL GRPOTrainer's arguments, with
its meanings), and the same experience and update phases as a single-turn one after them.

What differs from a single-turn update is only what reaches ``make_experience``: the completions hold the tool
results between the model's turns; the loss mask marks the model's own tokens apart from the attention mask; the
per-turn rewards sit on each turn's last token (``trl_ext.ppo.advantages.compute_model_token_advantages``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trl_ext.agents import templates
from trl_ext.agents.environments import EnvironmentPool
from trl_ext.agents.tools import Toolbox, ToolCounts, check_tools, environment_tools
from trl_ext.agents.trajectory import Trajectory, to_batch
from trl_ext.agents.turns import run_turns
from trl_ext.errors import InputError
from trl_ext.ppo.rollout.interface import completion_token_ids, trimmed
from trl_ext.ppo.timing import PhaseClock
from trl_ext.rewards.classifier import is_conversation
from trl_ext.rewards.scoring import RewardScorer

ROLLOUT_FUNC_KEYS = ("prompt_ids", "completion_ids", "logprobs")
NOT_RESET_ARGUMENTS = ("input_ids", "attention_mask")  # trl-ext's tokenized prompt: no column of the user's rows


class MultiTurn:
    """What a trainer holds for multi-turn rollouts; ``train_step(rows)`` is its ``train_step`` then."""

    def __init__(self, trainer, tools: list[Callable] | None = None, environment_factory: Callable | None = None,
                 rollout_func: Callable | None = None):
        self.trainer = trainer
        self.tools = list(tools or [])
        self.pool = EnvironmentPool(environment_factory) if environment_factory is not None else None
        self.rollout_func = rollout_func
        if rollout_func is not None and (self.tools or self.pool is not None):
            raise InputError("rollout_func makes the whole rollout: give it alone, or tools / environment_factory "
                             "without it (trl-ext does not run the tool loop after a rollout_func)")
        if trainer.config.score_position != "last_token":
            raise InputError("multi-turn rollouts need score_position='last_token': the position after a response "
                             "is no model token when the environment spoke last")
        if self.uses_tools:
            check_tools(self.tools + self.pool.probe_tools() if self.pool else self.tools)
            templates.prepare_tokenizer(trainer.tokenizer)
        if self.pool is not None and self.pool.has_reward:  # one more reward source, weight 1 (TRL's rule)
            rewards = trainer.rewards
            trainer.rewards = RewardScorer(rewards.funcs + [self.pool.reward_function()], rewards.weights + [1.0])

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) or self.pool is not None

    # ------------------------------------------------------------------ one update

    def train_step(self, rows: dict) -> dict:
        trainer = self.trainer
        device = trainer.accelerator.device
        clock = PhaseClock(device)
        size = len(rows["input_ids"])
        row_dicts = [{k: v[i] for k, v in rows.items() if k not in NOT_RESET_ARGUMENTS} for i in range(size)]
        prompts = rows.get("prompt") or trainer.tokenizer.batch_decode(rows["input_ids"])
        environments = None  # 1. roll out
        if self.pool is not None:
            environments = self.pool.take(size)
            prompts = self.pool.reset(environments, row_dicts, self._conversations(prompts))
        extra = {}
        if self.rollout_func is not None:
            trajectories, counts, extra = self._from_rollout_func(prompts)
        else:
            trajectories, counts = self._tool_loop(self._conversations(prompts), environments)
        clock.lap("generate")
        completions = [t.messages for t in trajectories]  # 2. score, as TRL's GRPO calls reward functions
        completion_ids = [t.ids for t in trajectories]
        if environments is not None:
            extra["environments"] = environments
        trainer.state.global_step = trainer.update_index
        scores, stats = trainer.rewards.score({**rows, **extra}, prompts, completions, completion_ids, trainer.state)
        scores = torch.tensor(scores, dtype=torch.float32, device=device)
        clock.lap("reward")
        batch = to_batch(trajectories, trainer.tokenizer.pad_token_id, device)  # 3.-5. experience, 6. update
        experience = trainer._experience(batch.query_ids, batch.query_mask, batch.responses, batch.loss_mask, scores,
                                         batch.sampling_logprobs, attention=batch.attention,
                                         turn_rewards=batch.turn_rewards)
        clock.lap("experience")
        stats.update(trainer._update(*experience))
        clock.lap("update")
        stats.update(rollout_metrics(trajectories, counts, trainer.accelerator, self.uses_tools))
        stats.update(clock.timings)
        stats["samples"] = [(p, c) for p, c in zip(prompts[:2], completions[:2])]
        return stats

    def _conversations(self, prompts: list) -> list[list[dict]]:
        if not all(is_conversation(p) for p in prompts):
            raise InputError("tools and environments need conversational prompts (lists of {'role', 'content'} "
                             "messages): the chat template renders the tools and the tool results")
        return [list(p) for p in prompts]

    def _tool_loop(self, prompts: list[list[dict]], environments: list | None) -> tuple[list[Trajectory], ToolCounts]:
        trainer = self.trainer
        tokenizer, config = trainer.tokenizer, trainer.config
        toolboxes = [Toolbox(self.tools + (environment_tools(e) if environments is not None else []))
                     for e in (environments or [None] * len(prompts))]
        prompt_ids = [templates.prompt_ids(tokenizer, p, box.tools) for p, box in zip(prompts, toolboxes)]
        max_positions = getattr(trainer.policy.config, "max_position_embeddings", None)
        return run_turns(self._sample, tokenizer, prompt_ids, toolboxes, config.response_length,
                         config.max_tool_calling_iterations, max_positions)

    def _sample(self, queries: list[list[int]], max_new_tokens: int):
        """One turn for each query with the trainer's rollout engine: new ids up to eos, the engine's log-probs."""
        trainer, tokenizer = self.trainer, self.trainer.tokenizer
        sampled = trainer._sample(*trainer._pad_queries(queries), max_new_tokens=max_new_tokens)
        responses, mask, logprobs = trimmed(sampled, tokenizer.eos_token_id, tokenizer.pad_token_id)
        ids = completion_token_ids(responses, mask)
        if logprobs is None:
            return ids, None
        return ids, [row[:len(i)] for row, i in zip(logprobs.tolist(), ids)]

    def _from_rollout_func(self, prompts: list) -> tuple[list[Trajectory], ToolCounts, dict]:
        """TRL's contract: ``rollout_func(prompts, trainer)`` gets each prompt once (the batch holds
        ``num_generations`` rows a prompt) and returns ``prompt_ids``, ``completion_ids``, ``logprobs`` for every
        completion, optionally ``env_mask`` (1 on the model's tokens); other keys go to the reward functions."""
        trainer = self.trainer
        groups = trainer.config.num_generations
        output = self.rollout_func(prompts[::groups], trainer)
        if not isinstance(output, dict) or any(k not in output for k in ROLLOUT_FUNC_KEYS):
            got = sorted(output) if isinstance(output, dict) else type(output).__name__
            raise InputError(f"rollout_func must return a dict with keys {', '.join(ROLLOUT_FUNC_KEYS)} (and maybe "
                             f"env_mask); got {got}")
        count = len(prompts)
        env_mask = output.get("env_mask")
        for key in (*ROLLOUT_FUNC_KEYS, "env_mask"):
            values = output.get(key)
            if values is not None and len(values) != count:
                raise InputError(f"rollout_func returned {len(values)} {key} for {count} completions "
                                 f"({count // groups} prompts x num_generations {groups})")
        trajectories = []
        for i in range(count):
            ids = list(output["completion_ids"][i])
            mask = [1] * len(ids) if env_mask is None else [int(m) for m in env_mask[i]]
            logprobs = None if output["logprobs"] is None or output["logprobs"][i] is None \
                else [float(x) for x in output["logprobs"][i]]
            if len(mask) != len(ids) or (logprobs is not None and len(logprobs) != len(ids)):
                raise InputError(f"rollout_func completion {i}: {len(ids)} completion_ids but {len(mask)} env_mask "
                                 "values or a different number of logprobs")
            if not any(mask):
                raise InputError(f"rollout_func completion {i} has no model token (env_mask all 0)")
            t = Trajectory(list(output["prompt_ids"][i]), ids, mask, logprobs)
            t.model_turns = sum(1 for k, m in enumerate(mask) if m and (k == 0 or not mask[k - 1]))  # runs of 1s
            t.messages = self._decoded(ids, t.prompt_ids, prompts[i])
            trajectories.append(t)
        extra = {k: v for k, v in output.items() if k not in (*ROLLOUT_FUNC_KEYS, "env_mask")}
        return trajectories, ToolCounts(), extra

    def _decoded(self, ids: list[int], prefix: list[int], prompt):
        """A completion as TRL hands it to reward functions: text, or one assistant message (parsed where the
        tokenizer has a response parser)."""
        tokenizer = self.trainer.tokenizer
        if not is_conversation(prompt):
            return tokenizer.decode(ids, skip_special_tokens=True)
        if getattr(tokenizer, "response_template", None) is not None:
            return [templates.parse_turn(tokenizer, ids, prefix, self.tools)[0]]
        return [{"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}]


def rollout_metrics(trajectories: list[Trajectory], counts: ToolCounts, accelerator, uses_tools: bool) -> dict:
    """Per update, over every process: tool calls per rollout and the share that failed (TRL's
    ``tools/call_frequency``, ``tools/failure_frequency``), malformed calls, dropped results, turns per rollout,
    the model's and the environment's tokens per rollout, the mean per-turn reward."""
    local = torch.tensor([len(trajectories), counts.calls, counts.failures, counts.unknown, counts.malformed,
                          counts.overlong, sum(t.model_turns for t in trajectories),
                          sum(t.model_tokens for t in trajectories), sum(t.environment_tokens for t in trajectories),
                          sum(r for t in trajectories for _, r in t.turn_rewards)],
                         dtype=torch.float64, device=accelerator.device)
    if accelerator.num_processes > 1:
        local = accelerator.reduce(local, reduction="sum")
    (rollouts, calls, failures, unknown, malformed, overlong, turns, model_tokens, env_tokens,
     turn_rewards) = local.tolist()
    metrics = {"tokens/model_per_rollout": model_tokens / rollouts, "tokens/environment_per_rollout": env_tokens /
               rollouts, "turns/per_rollout": turns / rollouts, "turns/reward_per_rollout": turn_rewards / rollouts}
    if uses_tools:
        metrics.update({"tools/call_frequency": calls / rollouts,
                        "tools/failure_frequency": failures / calls if calls else 0.0,
                        "tools/unknown_calls": unknown, "tools/malformed_calls": malformed,
                        "tools/dropped_results": overlong})
    return metrics
