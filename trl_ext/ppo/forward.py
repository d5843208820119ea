"""The forward passes of an update over query + response rows: the policy (with the critic's values), with
or without gradients, and the frozen reference. Logits are computed for the response positions only and
turned into float32 log-probs at once; passes run in as many rows as keep their logits within the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trl_ext.errors import InputError
from trl_ext.ppo.lm_head import TokenLogprobs, check_plain_head, token_logprobs
from trl_ext.ppo.rollout.loop import last_positions
from trl_ext.ppo.sharding import gathered_for_rollout

# Logit values (rows x tokens x vocabulary) one automatically sized forward pass may produce on CPU: 512 MB in
# float32, whatever the batch, response length or vocabulary.
LOGITS_BUDGET = 2**27


def rows_per_pass(option: int, batch: int, tokens: int, vocab: int, budget: int = LOGITS_BUDGET) -> int:
    """Rows of one forward pass over ``batch`` rows of ``tokens`` response positions: ``option``, or
    (``option == 0``) as many as keep the pass's logits within ``budget`` values; at least 1."""
    if option > 0:
        return min(option, batch)
    return max(1, min(batch, budget // max(1, tokens * vocab)))


# On a GPU a pass takes about the same time whatever its rows (docs/results.md, "On one GPU"), so there the
# automatic size follows the card's memory instead of LOGITS_BUDGET: one logit value per 64 bytes of it (a pass's
# bf16 logits fill at most 1/32 of the card).
GPU_MEMORY_PER_LOGIT = 64


def logits_budget(device: torch.device) -> int:
    """Logit values one automatically sized pass may produce on ``device``."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // GPU_MEMORY_PER_LOGIT
    return LOGITS_BUDGET


@dataclass
class PolicyOutput:
    """The policy's pass over a batch, with its graph."""

    logprobs: torch.Tensor  # (B, R) log-probs of the responses
    entropy: torch.Tensor  # (B, R) the policy's entropy per token (with its graph when ``ent_coef > 0``)
    values: torch.Tensor | None  # (B, P + R) the critic's values; None without a critic or with it apart


def critic_apart(model, accelerator) -> bool:
    """Whether the update runs the critic's pass apart from the policy's, each followed by its own backward, so
    the two graphs are never held at once (peak memory of one pass, not two): where the critic has a backbone of its
    own (a copy or an adapter) and one undistributed process holds the model. DDP and FSDP reduce gradients once a
    backward and DeepSpeed steps on each, so there (even on one process) the two losses keep one backward."""
    from accelerate.utils import DistributedType

    one_process = accelerator.num_processes == 1 and accelerator.distributed_type == DistributedType.NO
    return one_process and accelerator.unwrap_model(model).critic_has_backbone


def check_chunked_head(models, accelerator) -> None:
    """``chunked_lm_head`` where it computes what the models (the policy, a reference of its own) would: a plain
    linear head (``lm_head.py``), and a launch whose parameters are whole inside a forward (one process or DDP: FSDP
    and DeepSpeed shard or partition the head, which the backward pass's recomputation would find gathered no
    longer)."""
    from accelerate.utils import DistributedType

    for model in models:
        check_plain_head(model)
    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise InputError(
            f"chunked_lm_head runs on one process or under DDP; this launch is {accelerator.distributed_type.value}: "
            "leave chunked_lm_head off"
        )


class ForwardPasses:
    """``model`` is the prepared actor-critic (maybe DDP/FSDP-wrapped), ``policy`` the causal LM inside it;
    ``ref_policy`` the frozen reference, or None when it is ``policy`` with its LoRA adapters off."""

    def __init__(self, model, policy, ref_policy, accelerator, config, vocab_size: int):
        self.model, self.policy, self.ref_policy = model, policy, ref_policy
        self.accelerator, self.config, self.vocab_size = accelerator, config, vocab_size
        self.critic_apart = critic_apart(model, accelerator)
        self.chunked_head = config.chunked_lm_head
        if self.chunked_head:
            check_chunked_head([m for m in (policy, ref_policy) if m is not None], accelerator)

    @staticmethod
    def logits_to_keep(responses: torch.Tensor) -> int:
        """Logits of the positions that predict response tokens (and the last one, dropped): no prompt logits."""
        return responses.shape[1] + 1

    def kept_positions(self, query_response: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """The model's ``logits_to_keep``: those positions' indices (``rollout.loop.last_positions``: an int is 100x
        slower)."""
        return last_positions(query_response.shape[1], self.logits_to_keep(responses), query_response.device)

    def rows(self, option: int, batch: int, responses: torch.Tensor) -> int:
        """Rows of one pass: ``option``, or (0) as many as keep its logits within the budget; with the chunked head,
        which makes no logits, the whole batch."""
        if self.chunked_head and option == 0:
            return batch
        return rows_per_pass(
            option, batch, self.logits_to_keep(responses), self.vocab_size, logits_budget(self.accelerator.device)
        )

    def parts(self, responses: torch.Tensor) -> list[slice]:
        """Rows of the no-grad passes (``local_rollout_forward_batch_size``)."""
        rows = self.rows(self.config.local_rollout_forward_batch_size, len(responses), responses)
        return [slice(start, start + rows) for start in range(0, len(responses), rows)]

    def policy_pass(
        self, query_response, attention_mask, position_ids, responses, critic_only: bool = False
    ) -> PolicyOutput:
        """The update's forward pass, with gradients (``critic_only``: the values' alone, for critic warm-up); the
        critic's values too unless it runs apart (``value_pass``)."""
        request = self.request(responses, entropy=True)
        with self.accelerator.autocast():  # bf16/fp16 forward; log-probs, KL and losses stay float32
            (logprobs, entropy), values = self.model(
                query_response,
                attention_mask,
                position_ids,
                logits_to_keep=self.kept_positions(query_response, responses),
                critic_only=critic_only,
                outputs="logits" if self.critic_apart else "both",
                logprobs_of=request,
            )
        return PolicyOutput(logprobs, entropy, values)

    def request(self, responses: torch.Tensor, entropy: bool = False) -> TokenLogprobs:
        """What a pass computes of ``responses``: their log-probs (and the entropy, its gradient with an entropy
        bonus), through the model's head or the chunked one."""
        cfg = self.config
        return TokenLogprobs(responses, cfg.temperature, entropy, cfg.ent_coef > 0, self.chunked_head)

    def value_pass(self, query_response, attention_mask, position_ids) -> torch.Tensor:
        """The critic's own pass, with gradients (``critic_apart``): values ``(B, P + R)``."""
        with self.accelerator.autocast():
            return self.model(query_response, attention_mask, position_ids, outputs="values")[1]

    @torch.no_grad()
    def old_values(self, inputs, responses) -> torch.Tensor:
        """The critic's values before the update at the response positions ``(B, R)``, its pass alone."""
        length = inputs[0].shape[1] - responses.shape[1]
        values = [self.value_pass(*(x[part] for x in inputs)) for part in self.parts(responses)]
        return torch.cat(values)[:, length - 1 : -1].float()

    @torch.no_grad()
    def old_policy(self, inputs, responses) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of the policy before the update ``(B, R)`` and the critic's values ``(B, R)`` (None without
        one)."""
        length, keep = inputs[0].shape[1] - responses.shape[1], self.kept_positions(inputs[0], responses)
        old_logprobs, values = [], []
        for part in self.parts(responses):
            request = self.request(responses[part])
            with self.accelerator.autocast():
                (logprobs, _), part_values = self.model(
                    *(x[part] for x in inputs), logits_to_keep=keep, logprobs_of=request
                )
            old_logprobs.append(logprobs)
            if part_values is not None:
                values.append(part_values[:, length - 1 : -1].float())
        return torch.cat(old_logprobs), torch.cat(values) if values else None

    def reference_logprobs(
        self, query_response, attention_mask, position_ids, logits_to_keep: torch.Tensor, request: TokenLogprobs
    ) -> torch.Tensor:
        """The reference's log-probs of ``request.tokens`` ``(B, R)``."""
        inputs = dict(
            input_ids=query_response, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        with self.accelerator.autocast():
            if self.ref_policy is not None:
                return token_logprobs(self.ref_policy, inputs, logits_to_keep, request)[0]
            # The base model under the LoRA adapters is the reference; the policy is a child of the
            # (maybe sharded) root, so its parameters are gathered for the call.
            with gathered_for_rollout(self.model), self.policy.disable_adapter():
                return token_logprobs(self.policy, inputs, logits_to_keep, request)[0]

    @torch.no_grad()
    def reference(self, inputs, responses) -> torch.Tensor:
        """Log-probs of the reference ``(B, R)``."""
        keep = self.kept_positions(inputs[0], responses)
        return torch.cat(
            [
                self.reference_logprobs(*(x[part] for x in inputs), keep, self.request(responses[part]))
                for part in self.parts(responses)
            ]
        )
