"""The update: ``num_ppo_epochs`` x ``num_mini_batches`` optimizer steps over one batch's experience (and the
critic's own epochs beyond them, ``num_critic_epochs``), each minibatch's gradient accumulated over micro-batches
weighted by their share of it, so that the result is the minibatch's own whatever the micro-batch size.

The trainer hands in one ``StepHooks``: how a step is taken (``backward``, ``optimizer_step``: accelerate's, or a
subclass's), how rows are shuffled (``minibatch_order``), what a non-finite loss does (``on_bad_loss``) and whom
to tell that the weights moved (``policy_changed``: the rollout engine).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

import torch

from trl_ext.ppo import core, losses
from trl_ext.ppo.config import mini_batch_size
from trl_ext.ppo.experience import Experience
from trl_ext.ppo.forward import ForwardPasses, PolicyOutput


def critic_epochs(config) -> int:
    """Passes of the value loss over each batch: ``num_critic_epochs``, else ``num_ppo_epochs``."""
    return config.num_critic_epochs if config.num_critic_epochs is not None else config.num_ppo_epochs


class StepHooks(Protocol):
    """How the learner's steps are taken, declared once: the trainer's hooks (accelerate's backward and step, or a
    subclass's), how rows are shuffled, what a non-finite loss does and whom to tell that the weights moved."""

    def backward(self, loss: torch.Tensor) -> None: ...

    def optimizer_step(self) -> None: ...

    def minibatch_order(self, size: int) -> torch.Tensor: ...

    def on_bad_loss(self, loss: torch.Tensor, epoch: int, minibatch: int) -> None: ...

    def policy_changed(self) -> None: ...


class Learner:
    def __init__(self, passes: ForwardPasses, config, accelerator, hooks: StepHooks):
        self.passes, self.config, self.accelerator, self.hooks = passes, config, accelerator, hooks

    def optimizer_step(self) -> None:
        """The step, then word to the rollout engine: here, not in the step hook a subclass may replace, so that an
        engine holding its own copy of the weights (vLLM) can never miss a change."""
        self.hooks.optimizer_step()
        self.hooks.policy_changed()

    def micro_batch_rows(self, batch: int, responses: torch.Tensor) -> int:
        """Rows of an update micro-batch: ``micro_batch_size`` (auto: the logits budget). DeepSpeed's engine
        steps on every backward that accelerate routes to it, so under DeepSpeed a minibatch is one micro-batch."""
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            return batch
        return self.passes.rows(self.config.micro_batch_size, batch, responses)

    def one_forward(self, responses: torch.Tensor, warming_up: bool) -> bool:
        """Whether the first optimizer step's forward pass covers the whole batch (one minibatch, one micro-batch):
        the experience phase then runs that pass with its graph (``make_experience``), and its detached log-probs
        and values are the old ones, equal to a no-grad pass's since the weights have not moved yet. It saves a
        pass of the policy (and of a shared critic; a critic apart takes its old values from a no-grad pass of its
        own) an update, at any number of epochs. Not while the critic warms up: its steps run the critic alone."""
        cfg, batch = self.config, len(responses)
        return cfg.num_mini_batches == 1 and not warming_up and self.micro_batch_rows(batch, responses) >= batch

    def update(
        self, exp: Experience, forward: PolicyOutput | None = None, warming_up: bool = False
    ) -> dict[str, torch.Tensor]:
        """Every optimizer step of one batch; the stats averaged over its (epoch, minibatch) steps.
        ``forward``: the experience phase's own pass, with its graph (``one_forward``): the first epoch's step reads it.
        ``warming_up``: the value function alone learns (critic warm-up)."""
        cfg, size = self.config, mini_batch_size(self.config)
        steps: dict[str, list[torch.Tensor]] = {}  # name -> one value per (epoch, minibatch)
        first_epoch = 0
        if forward is not None:  # the first epoch's one step, on the experience phase's pass
            # The row order of a full-batch mean does not matter; it is drawn as the minibatch loop draws it so a
            # run's random stream stays the one of the path without the fused pass.
            self.hooks.minibatch_order(len(exp))
            check = partial(self._stop_if_non_finite, epoch=0, minibatch=0)
            _, stats = self._backward(exp, exp, forward, warming_up, check)
            self.optimizer_step()
            for name, value in stats.items():
                steps[name] = [value.detach()]
            first_epoch = 1
        for epoch in range(first_epoch, critic_epochs(cfg)):
            critic_alone = epoch >= cfg.num_ppo_epochs  # num_critic_epochs' passes beyond PPO's
            order = self.hooks.minibatch_order(len(exp))
            for mb_index in range(cfg.num_mini_batches):
                mb = exp.minibatch(order[mb_index * size : (mb_index + 1) * size].to(exp.mask.device))
                mb_stats = self._minibatch(mb, epoch, mb_index, warming_up, critic_alone)
                self.optimizer_step()
                for name, value in mb_stats.items():
                    steps.setdefault(name, []).append(value)
        return {name: torch.stack(values).mean() for name, values in steps.items()}

    def _minibatch(self, mb: Experience, epoch: int, mb_index: int, warming_up: bool, critic_alone: bool) -> dict:
        """The gradient of one minibatch, accumulated over its micro-batches, and its stats. ``critic_alone``: the
        value loss alone, from the critic's pass alone (its stats alone too, so the policy's average its own steps)."""
        mb_stats: dict[str, torch.Tensor] = {}
        micro_batches, total = self._micro_batches(mb), 0.0
        for i, micro in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            check = partial(self._stop_if_non_finite, epoch=epoch, minibatch=mb_index, earlier=total)
            if critic_alone:
                loss, micro_stats = self._value_loss(micro, mb, self._critic_values(micro))
                if last:
                    check(loss.detach())
                self.hooks.backward(loss)
                loss = loss.detach()
            else:
                forward = self.passes.policy_pass(
                    micro.query_response,
                    micro.attention_mask,
                    micro.position_ids,
                    micro.responses,
                    critic_only=warming_up,
                )
                loss, micro_stats = self._backward(micro, mb, forward, warming_up, check if last else None)
            total = total + loss
            for name, value in micro_stats.items():  # each already weighted by its share
                mb_stats[name] = mb_stats.get(name, 0.0) + value.detach()
        return mb_stats

    def _critic_values(self, micro: Experience) -> torch.Tensor:
        """The values ``(B, P + R)`` of the critic's pass alone: its own backbone's, or the head's on the policy's
        backbone run without gradients (``critic_only``), so a shared backbone stays the policy's."""
        inputs = micro.query_response, micro.attention_mask, micro.position_ids
        if self.passes.critic_apart:
            return self.passes.value_pass(*inputs)
        return self.passes.policy_pass(*inputs, micro.responses, critic_only=True).values

    def _backward(
        self, micro: Experience, mb: Experience, forward: PolicyOutput, warming_up: bool, check: Callable | None
    ):
        """``micro``'s loss (detached) and stats, its gradient accumulated; ``check(loss)``, if given, runs before its
        last backward (the one DeepSpeed's engine would step on). With the critic apart (``ForwardPasses.critic_apart``)
        the policy's backward frees its graph before the critic's pass builds its own."""
        loss, stats = self._loss(micro, mb, forward, warming_up)
        if self.passes.critic_apart:
            if loss.requires_grad:  # not during the critic's warm-up, whose policy term is a constant 0
                self.hooks.backward(loss)
            values = self.passes.value_pass(micro.query_response, micro.attention_mask, micro.position_ids)
            value_loss, value_stats = self._value_loss(micro, mb, values)
            loss, stats = loss.detach() + value_loss, {**stats, **value_stats}
        if check is not None:
            check(loss.detach())
        self.hooks.backward(loss)
        return loss.detach(), stats

    def _stop_if_non_finite(self, loss: torch.Tensor, epoch: int, minibatch: int, earlier=0.0) -> None:
        """A non-finite minibatch loss on any rank stops every rank before an optimizer step uses it: checked
        once a minibatch (one read back to the host), on the sum of its micro-batches' losses (``earlier``, the
        sum before the last one's ``loss``)."""
        minibatch_loss = earlier + loss
        bad = (~torch.isfinite(minibatch_loss)).float().reshape(1)
        if self.accelerator.num_processes > 1:
            bad = self.accelerator.reduce(bad, reduction="sum")
        if bad.item() > 0:
            self.hooks.on_bad_loss(minibatch_loss, epoch, minibatch)

    def _micro_batches(self, mb: Experience) -> list[Experience]:
        """``micro_batch_rows`` rows at a time, or with ``padding_free`` as many as fill that many packed rows
        (``ForwardPasses.slices``)."""
        if self.micro_batch_rows(len(mb), mb.responses) >= len(mb):
            return [mb]
        parts = self.passes.slices(self.config.micro_batch_size, mb.attention_mask, mb.responses)
        device = mb.mask.device
        return [mb.minibatch(torch.arange(len(mb), device=device)[part]) for part in parts]

    def _loss(self, micro: Experience, mb: Experience, forward: PolicyOutput, warming_up: bool):
        """The loss of ``micro`` weighted by its share of minibatch ``mb`` (so the accumulated gradient is the
        minibatch's), and its stats weighted likewise (they sum to the minibatch's)."""
        cfg, outcome = self.config, micro.outcome
        pg_loss, pg = losses.policy_loss(
            forward.logprobs,
            micro.old_logprobs,
            micro.ref_logprobs,
            outcome.advantages,
            micro.mask,
            cfg,
            micro.importance_weights,
        )
        pg_share, pg_stats_share = losses.policy_loss_shares(cfg, micro.mask, mb.mask)
        tokens = losses.share("tokens", micro.mask, mb.mask)
        entropy = core.masked_mean(forward.entropy, micro.mask)
        loss = pg_share * pg_loss - cfg.ent_coef * tokens * entropy
        stats = {
            "loss/policy_avg": pg_share * pg_loss,
            "policy/clipfrac_avg": pg_stats_share * pg["clipfrac"],
            "policy/approxkl_avg": pg_stats_share * pg["approxkl"],
            "val/ratio": pg_stats_share * pg["ratio"],
            "policy/entropy_avg": tokens * entropy,
        }
        if cfg.positive_lm_coef > 0:  # VAPO: the likelihood of the rows scored above the threshold, raised

            def positive(exp):
                return exp.outcome.scores > cfg.positive_lm_threshold

            whole = (mb.mask.bool() & positive(mb)[:, None]).sum().to(forward.logprobs.dtype)
            lm_loss = losses.positive_lm_loss(forward.logprobs, micro.mask, positive(micro), whole)
            loss = loss + cfg.positive_lm_coef * lm_loss
            stats["loss/positive_lm_avg"] = lm_loss
        if warming_up:  # stats as usual, but no policy term in the loss
            loss = pg_loss.new_zeros(())
        if "kl_loss" in pg:
            stats["loss/kl_avg"] = tokens * pg["kl_loss"]
        if forward.values is not None:  # None: a critic-free estimator, or the critic apart (``_backward``)
            value_loss, value_stats = self._value_loss(micro, mb, forward.values)
            loss, stats = loss + value_loss, {**stats, **value_stats}
        return loss, stats

    def _value_loss(self, micro: Experience, mb: Experience, values: torch.Tensor):
        """The clipped value loss of ``micro``'s values ``(B, P + R)``, weighted by its tokens' share of ``mb``."""
        cfg, outcome = self.config, micro.outcome
        new_values = values[:, micro.query_length - 1 : -1].float()
        vf_loss, vf = core.clipped_value_loss(
            new_values, outcome.values, outcome.returns, outcome.value_mask, cfg.cliprange_value
        )
        value_share = losses.share("tokens", outcome.value_mask, mb.outcome.value_mask)
        stats = {"loss/value_avg": value_share * vf_loss, "val/clipfrac_avg": value_share * vf["clipfrac"]}
        return cfg.vf_coef * value_share * vf_loss, stats
