"""The forward passes of an update over query + response rows: the policy (with the critic's values), with
or without gradients, and the frozen reference. Logits are computed for the response positions only and
turned into float32 log-probs at once; passes run in as many rows as keep their logits within the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from trl_ext.errors import InputError
from trl_ext.ppo.lm_head import TokenLogprobs, check_plain_head, token_logprobs
from trl_ext.ppo.packing import check_padding_free, pack, token_parts
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
        self.padding_free = config.padding_free
        if self.padding_free:
            critic = getattr(accelerator.unwrap_model(model), "critic_backbone", None)
            check_padding_free([m for m in (policy, ref_policy, critic) if m is not None])

    @staticmethod
    def logits_to_keep(responses: torch.Tensor) -> int:
        """Logits of the positions that predict response tokens (and the last one, dropped): no prompt logits."""
        return responses.shape[1] + 1

    def kept_positions(self, query_response: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """The model's ``logits_to_keep``: those positions' indices (``rollout.loop.last_positions``: an int is 100x
        slower)."""
        return last_positions(query_response.shape[1], self.logits_to_keep(responses), query_response.device)

    def rows(self, option: int, batch: int, responses: torch.Tensor, width: int = 0) -> int:
        """Rows of one pass: ``option``, or (0) as many as keep its logits within the budget (``width``: logits at
        that many positions a row, a packed row's; else the responses'); with the chunked head, which makes no
        logits, the whole batch."""
        if self.chunked_head and option == 0:
            return batch
        positions = width or self.logits_to_keep(responses)
        return rows_per_pass(option, batch, positions, self.vocab_size, logits_budget(self.accelerator.device))

    def slices(self, option: int, attention_mask: torch.Tensor, responses: torch.Tensor) -> list[slice]:
        """The rows of each pass over a batch: ``rows`` at a time, or with ``padding_free`` as many as fill that
        many packed rows by their real tokens (by rows on several processes, where every rank must run as many
        passes for DDP's reductions and FSDP's gathers)."""
        batch, width = attention_mask.shape
        if not self.padding_free:
            rows = self.rows(option, batch, responses)
        else:
            rows = self.rows(option, batch, responses, width)
            if self.accelerator.num_processes == 1:
                return token_parts(attention_mask.sum(1), rows * width)
        return [slice(start, start + rows) for start in range(0, batch, rows)]

    def parts(self, inputs, responses: torch.Tensor) -> list[slice]:
        """Rows of the no-grad passes (``local_rollout_forward_batch_size``)."""
        return self.slices(self.config.local_rollout_forward_batch_size, inputs[1], responses)

    def _pass(self, call, inputs, request: TokenLogprobs | None, model):
        """``call(input_ids, attention_mask, position_ids, logits_to_keep, request)`` -> ``((log-probs, entropy) or
        None, values or None)`` on the padded rows ``inputs``, or with ``padding_free`` on their packed rows (the mask
        in ``model``'s dtype), read back into the padded layout."""
        if not self.padding_free:
            keep = None if request is None else self.kept_positions(inputs[0], request.tokens)
            return call(*inputs, keep, request)
        packed = pack(*inputs, model.get_input_embeddings().weight.dtype)
        packed_request = None if request is None else replace(request, tokens=packed.tokens)
        first, values = call(*packed.inputs(), packed.keep, packed_request)
        if first is not None:
            length = request.tokens.shape[1]
            first = tuple(None if x is None else packed.responses(x, length) for x in first)
        return first, None if values is None else packed.unpack(values)

    def policy_pass(
        self, query_response, attention_mask, position_ids, responses, critic_only: bool = False
    ) -> PolicyOutput:
        """The update's forward pass, with gradients (``critic_only``: the values' alone, for critic warm-up); the
        critic's values too unless it runs apart (``value_pass``)."""
        outputs = "logits" if self.critic_apart else "both"

        def call(ids, mask, positions, keep, request):
            return self.model(
                ids, mask, positions, logits_to_keep=keep, critic_only=critic_only, outputs=outputs, logprobs_of=request
            )

        inputs = (query_response, attention_mask, position_ids)
        with self.accelerator.autocast():  # bf16/fp16 forward; log-probs, KL and losses stay float32
            (logprobs, entropy), values = self._pass(call, inputs, self.request(responses, entropy=True), self.policy)
        return PolicyOutput(logprobs, entropy, values)

    def request(self, responses: torch.Tensor, entropy: bool = False) -> TokenLogprobs:
        """What a pass computes of ``responses``: their log-probs (and the entropy, its gradient with an entropy
        bonus), through the model's head or the chunked one."""
        cfg = self.config
        return TokenLogprobs(responses, cfg.temperature, entropy, cfg.ent_coef > 0, self.chunked_head)

    def value_pass(self, query_response, attention_mask, position_ids) -> torch.Tensor:
        """The critic's own pass, with gradients (``critic_apart``): values ``(B, P + R)``."""

        def call(ids, mask, positions, keep, request):
            return self.model(ids, mask, positions, outputs="values")

        with self.accelerator.autocast():
            return self._pass(call, (query_response, attention_mask, position_ids), None, self.policy)[1]

    @torch.no_grad()
    def old_values(self, inputs, responses) -> torch.Tensor:
        """The critic's values before the update at the response positions ``(B, R)``, its pass alone."""
        length = inputs[0].shape[1] - responses.shape[1]
        values = [self.value_pass(*(x[part] for x in inputs)) for part in self.parts(inputs, responses)]
        return torch.cat(values)[:, length - 1 : -1].float()

    @torch.no_grad()
    def old_policy(self, inputs, responses) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of the policy before the update ``(B, R)`` and the critic's values ``(B, R)`` (None without
        one)."""
        length = inputs[0].shape[1] - responses.shape[1]

        def call(ids, mask, positions, keep, request):
            return self.model(ids, mask, positions, logits_to_keep=keep, logprobs_of=request)

        old_logprobs, values = [], []
        for part in self.parts(inputs, responses):
            request = self.request(responses[part])
            with self.accelerator.autocast():
                (logprobs, _), part_values = self._pass(call, [x[part] for x in inputs], request, self.policy)
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

        def call(ids, mask, positions, keep, request):
            return (self.reference_logprobs(ids, mask, positions, keep, request),), None

        model = self.ref_policy if self.ref_policy is not None else self.policy
        parts = self.parts(inputs, responses)
        return torch.cat(
            [self._pass(call, [x[part] for x in inputs], self.request(responses[part]), model)[0][0] for part in parts]
        )
