"""The experience of one batch: the rollouts, their log-probs under the policy that sampled them and the
reference, and what ``compute_advantages`` derives from their scores, as one record (fields grouped as
OpenRLHF's ``experience.py`` groups them), made by one function that owns the no-grad passes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass

import torch

from trl_ext.data.sequences import positions_from_mask
from trl_ext.ppo import core
from trl_ext.ppo.advantages import Advantages, compute_advantages
from trl_ext.ppo.forward import ForwardPasses, PolicyOutput
from trl_ext.rollouts.record import RolloutBatch


def _rows(record, index: torch.Tensor):
    """The rows ``index`` of every tensor of a dataclass record (nested records too; None stays None)."""
    values = {}
    for f in fields(record):
        value = getattr(record, f.name)
        values[f.name] = _rows(value, index) if is_dataclass(value) else None if value is None else value[index]
    return type(record)(**values)


@dataclass
class Experience:
    """One batch of rollouts and everything PPO derives from it before the update epochs."""

    # the trajectory
    query_response: torch.Tensor  # (B, P + R) left-padded query followed by the response
    attention_mask: torch.Tensor  # (B, P + R) 1 on real tokens
    position_ids: torch.Tensor  # (B, P + R)
    responses: torch.Tensor  # (B, R) sampled tokens, pad after the first eos
    mask: torch.Tensor  # (B, R) the loss mask: 1 on the tokens the policy sampled (up to and including eos);
    # in a multi-turn rollout 0 on tool results, which attention_mask keeps as context
    # log-probs of the responses
    old_logprobs: torch.Tensor  # (B, R) log pi_old(token), the trainer's own pass
    ref_logprobs: torch.Tensor  # (B, R) log pi_ref(token)
    # scores, KL, rewards, values, advantages and returns (``advantages.compute_advantages``)
    outcome: Advantages
    # what the rollout engine knew of its own sampling (``samplers.Completions.logprobs``), when it knew it
    sampling_logprobs: torch.Tensor | None = None  # (B, R) the engine's log-probs of ``responses``
    importance_weights: torch.Tensor | None = None  # (B, R) or (B, 1) the loss's correction for the gap (vLLM)

    @property
    def query_length(self) -> int:
        return self.query_response.shape[1] - self.responses.shape[1]

    def __len__(self) -> int:
        return self.responses.shape[0]

    def minibatch(self, index: torch.Tensor) -> Experience:
        """The rows ``index`` of every field (``b_*`` -> ``mb_*`` in cleanrl's words)."""
        return _rows(self, index)


@dataclass(frozen=True)
class ExperienceOptions:
    """How this update's experience is made (the trainer's state at this update, beside its config)."""

    eos_token_id: int
    needs_reference: bool  # a KL term somewhere: the reference's log-probs are needed
    one_forward: bool  # the update's first step is one forward over the whole batch (``Learner.one_forward``)
    kl_coef: float | None = None  # this batch's KL weight (an adaptive one's current value); None: config.kl_coef
    critic_lam: float | None = None  # this batch's lambda of the critic's returns (the warm-up's); None: the config's


@torch.no_grad()
def make_experience(
    passes: ForwardPasses, batch: RolloutBatch, scores: torch.Tensor, config, options: ExperienceOptions
) -> tuple[Experience, PolicyOutput | None]:
    """The no-grad passes over one rollout record and the estimator's advantages -> ``Experience``.

    ``options.one_forward``: the update's first step is one forward over the whole batch, so (as TRL's GRPO with
    ``num_iterations=1``) the old log-probs and values are that forward's own, detached: it runs here, with its
    graph, and is returned beside the record for the learner instead of a no-grad pass of its own.

    Every rollout is read the same way: the attention mask covers every completion token (a multi-turn rollout's
    tool results too), the loss mask the model's own, and advantages run over the model's tokens alone.
    """
    query_ids, responses, mask = batch.query_ids, batch.responses, batch.loss_mask
    query_response = torch.cat([query_ids, responses], dim=1)
    attention_mask = torch.cat([batch.query_mask.long(), batch.attention_mask.long()], dim=1)
    inputs = (query_response, attention_mask, positions_from_mask(attention_mask))
    # The reference first: a policy pass that is the update's keeps its graph until the backward.
    ref_logprobs = passes.reference(inputs, responses) if options.needs_reference else None
    forward = values = None
    if options.one_forward:
        passes.model.train()
        with torch.enable_grad():
            forward = passes.policy_pass(*inputs, responses)
        old_logprobs = forward.logprobs.detach()
        if forward.values is not None:  # as ForwardPasses.old_policy slices them: the response positions
            values = forward.values[:, query_ids.shape[1] - 1 : -1].detach().float()
        elif passes.critic_apart:  # the pass keeps the policy's graph alone; the critic's values without one
            values = passes.old_values(inputs, responses)
    else:
        old_logprobs, values = passes.old_policy(inputs, responses)
    if ref_logprobs is None:  # no KL term anywhere: KL 0, as if the reference were the policy
        ref_logprobs = old_logprobs
    group_ids = torch.arange(len(responses), device=responses.device) // config.num_generations
    ended = core.ends_with(responses, mask, options.eos_token_id)
    outcome = compute_advantages(
        scores,
        old_logprobs,
        ref_logprobs,
        values,
        mask,
        ended,
        group_ids,
        config,
        options.kl_coef,
        batch.turn_rewards,
        options.critic_lam,
    )
    weights = None
    sampling_logprobs = batch.sampling_logprobs
    if sampling_logprobs is not None and config.vllm_importance_sampling_correction:
        weights = core.importance_sampling_weights(
            old_logprobs,
            sampling_logprobs,
            mask,
            config.vllm_importance_sampling_mode,
            config.vllm_importance_sampling_clip_min,
            config.vllm_importance_sampling_clip_max,
        )
    experience = Experience(
        *inputs,
        responses=responses,
        mask=mask,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        outcome=outcome,
        sampling_logprobs=sampling_logprobs,
        importance_weights=weights,
    )
    return experience, forward
