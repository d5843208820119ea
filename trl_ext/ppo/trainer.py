"""The scratch trainer: the loop of the doubling tutorial's ``PPOTrainer.step``, batched, on accelerate.

One update, as the tutorials number it, each step a call into a part with one job:
  1. generate responses for a batch of prompts (``samplers``: the loop, ``generate``, static cache, vLLM)
  2. score them with the reward functions (``rewards.scoring``)
  3. log-probs of the policy (and values) and of the frozen reference (``forward``), then
  4. KL-shaped rewards and 5. advantages and returns, whitened (``advantages``): one record (``experience``)
  6. ``num_ppo_epochs`` x ``num_mini_batches`` clipped policy + value updates (``learner``)
Every formula is in ``trl_ext.ppo.core``. It does not import ``trl.experimental.ppo``: it is the scratch trainer for
users on TRL >= 1.13 too, and it is built like TRL's ``GRPOTrainer`` (``model``, ``reward_funcs``, ``args``,
``train_dataset``, ``processing_class``, ``peft_config``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from trl_ext.data.prompt_dataset import max_positions, prepare_prompt_dataset
from trl_ext.data.sequences import completion_token_ids
from trl_ext.errors import InputError, RolloutEngineError, TrainingError
from trl_ext.ppo import builder, checkpoint, core, optimizers, precision
from trl_ext.ppo.config import PPOConfig, num_updates
from trl_ext.ppo.config_checks import trackers, trainer_config
from trl_ext.ppo.critic_health import CriticHealth
from trl_ext.ppo.critic_warmup import CriticWarmup
from trl_ext.ppo.experience import Experience, ExperienceOptions, make_experience
from trl_ext.ppo.forward import ForwardPasses, PolicyOutput
from trl_ext.ppo.learner import Learner
from trl_ext.ppo.model import ActorCritic
from trl_ext.ppo.option_scopes import check_engine_options
from trl_ext.ppo.prompt_batches import prompt_batches
from trl_ext.ppo.rollout.samplers import build_sampler, resolve_sampler, trimmed
from trl_ext.ppo.rollout_ahead import RolloutAhead, check_staleness
from trl_ext.ppo.sampling import TrainerSampling
from trl_ext.ppo.timing import PhaseClock
from trl_ext.ppo.update_metrics import numeric_metrics, rollout_metrics, update_metrics
from trl_ext.rewards.base import place_reward
from trl_ext.rewards.scoring import RewardScorer, resolve_reward_funcs
from trl_ext.rollouts import RolloutBatch, build_rollout
from trl_ext.rollouts.given import given_rollouts


class PPOError(TrainingError):
    """Training cannot go on (a non-finite loss)."""


class TrainerHooks:
    """The learner's ``StepHooks``: the trainer's own hooks, looked up at each call (a subclass or a test may
    replace them), and the rollout engine told that the weights moved."""

    def __init__(self, trainer: PPOTrainer):
        self._trainer = trainer

    def backward(self, loss):
        self._trainer._backward(loss)

    def optimizer_step(self):
        self._trainer._optimizer_step()

    def minibatch_order(self, size: int):
        return self._trainer._minibatch_order(size)

    def on_bad_loss(self, loss, epoch: int, minibatch: int):
        self._trainer._stop_on_bad_loss(loss, epoch, minibatch)

    def policy_changed(self):
        self._trainer.sampler.policy_changed()


class PPOTrainer:
    """The scratch trainer, constructed like TRL's ``GRPOTrainer``.

    ``model``: a causal LM or the path of one. ``reward_funcs``: a callable, a path to a sequence
    classifier, or a list of them, summed with ``args.reward_weights`` (``None`` rewards are left
    out, as GRPO does). ``train_dataset``: a ``prompt`` column (text or a conversation) or an
    ``input_ids`` column, plus any columns the reward functions read. ``train()`` runs the whole
    loop; ``generate`` and ``step`` are the classic step-wise API (bring your own scores).
    ``tools``, ``environment_factory``, ``rollout_func``: multi-turn rollouts, with the meanings of TRL
    GRPOTrainer's arguments (``trl_ext.agents``, docs/multi-turn.md). ``rollout``: a ``trl_ext.rollouts.Rollout``
    (or its registered name; default ``args.rollout``) for any other kind of rollout.
    """

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: PPOConfig | None = None,
        train_dataset=None,
        processing_class=None,
        peft_config=None,
        ref_model=None,
        accelerator=None,
        tools=None,
        environment_factory=None,
        rollout_func=None,
        rollout=None,
    ):
        from accelerate import Accelerator
        from transformers import TrainerState

        config = self.config = trainer_config(args, PPOConfig)
        policy, self.tokenizer = builder.load_causal_lm(model, processing_class, config.dtype)
        self.rewards = RewardScorer(resolve_reward_funcs(reward_funcs, config.dtype), config.reward_weights)
        fits = self.tokenizer, config.response_length, max_positions(policy)  # a prompt and response in the context
        self.train_dataset = None if train_dataset is None else prepare_prompt_dataset(train_dataset, *fits)
        # cpu=True without a GPU: several launched processes then form a gloo group, not N lone runs.
        self.accelerator = acc = accelerator or Accelerator(
            cpu=not torch.cuda.is_available(),
            log_with=trackers(config.report_to) or None,
            project_dir=config.output_dir,
        )
        torch.manual_seed(config.seed)
        self.compute_dtype = precision.model_dtype(policy)  # the checkpoint's (or --dtype's), before master weights
        precision.check_device_supports(self.compute_dtype, acc.device)
        vocab_size = getattr(policy.config, "vocab_size", None) or policy.get_output_embeddings().weight.shape[0]
        model_dir = model if isinstance(model, (str, Path)) else None
        actor_critic, self.ref_policy = builder.build_models(
            policy,
            config,
            peft_config,
            ref_model,
            model_dir,
            uniform_dtype=self._shards_parameters(),
            device=acc.device,
        )
        self.model, self.optimizer = self._prepare(actor_critic)
        # Unwrapped once: accelerate's unwrap_model looks up installed packages on every call (ms each), and
        # its first call imports DeepSpeed where it is installed (a second), which would land in the first update.
        self._actor_critic = acc.unwrap_model(self.model)
        total = num_updates(config, acc.num_processes)
        self.lr_scheduler = optimizers.build_lr_scheduler(self.optimizer, config.lr_scheduler_type, total)
        for fn in self.rewards.funcs:  # a reward model scores where the policy runs
            place_reward(fn, acc.device)
        self.sampler_name = resolve_sampler(config, acc.device, self.policy)
        self.sampler = build_sampler(self.sampler_name, config)
        check_engine_options(config, self.sampler, self.sampler_name)
        self.generator = torch.Generator(device=acc.device).manual_seed(config.seed + 100003 * acc.process_index)
        self.passes = ForwardPasses(self.model, self.policy, self.ref_policy, acc, config, vocab_size)
        self.learner = Learner(self.passes, config, acc, TrainerHooks(self))
        self.episode, self.update_index, self.resumed_from = 0, 0, None
        self.kl_coef = config.kl_coef  # moves after each update when config.kl_target is set
        self.critic_warmup = CriticWarmup(config)
        self.critic_health = CriticHealth()  # the window of the critic's fits its pooled metrics read
        self.state = TrainerState(max_steps=total, global_step=0)  # what GRPO hands reward functions
        # What makes a batch's rollouts: TRL's multi-turn arguments, else `rollout` (an object, or its name)
        self.rollout = build_rollout(
            rollout if rollout is not None else config.rollout, tools, environment_factory, rollout_func
        )
        self.rollout.check(config, self.tokenizer)
        if self.rollout.reward_funcs:  # rewards the rollout brings (an environment's get_reward): weight 1 each
            self.rewards = RewardScorer(
                self.rewards.funcs + list(self.rollout.reward_funcs),
                self.rewards.weights + [1.0] * len(self.rollout.reward_funcs),
            )
        self.sampling = TrainerSampling(self)
        check_staleness(config.max_staleness, self.sampler, rollout_func, environment_factory)
        # One step off-policy: the next batch's rollout in flight during this update, with a generator of its own
        ahead = TrainerSampling(self, config.seed + 7919 + 100003 * acc.process_index) if config.max_staleness else None
        self.ahead = RolloutAhead(self.rollout, ahead) if ahead is not None else None
        if config.resume_from_checkpoint:  # checked now, before anything is written
            self.resumed_from = checkpoint.resolve(config.resume_from_checkpoint, config.output_dir)
            self._load_checkpoint(self.resumed_from)

    # ------------------------------------------------------------------ how a step is taken (subclass hooks)

    def _shards_parameters(self) -> bool:
        """Whether ``_prepare`` flattens parameters into shards (FSDP, DeepSpeed): they need one dtype."""
        from accelerate.utils import DistributedType

        return self.accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)

    def _prepare(self, model: ActorCritic):
        """Wrap ``model`` for the launch (DDP, DeepSpeed, FSDP: accelerate's ``prepare``) with its optimizer.

        The one place a model is made distributed: a subclass may shard it by other means (the
        FSDP2-on-CPU test calls ``fully_shard`` here, which accelerate does only on GPUs).
        """
        return self.accelerator.prepare(model, self._optimizer(model))

    def _optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        cfg = self.config
        return optimizers.build_optimizer(
            model, cfg.learning_rate, self.accelerator.device, cfg.optim, cfg.critic_learning_rate
        )

    def _backward(self, loss: torch.Tensor) -> None:
        """Gradients of a micro-batch's share of the loss, added to the minibatch's (a critic apart: two calls)."""
        self.accelerator.backward(loss)

    def _optimizer_step(self) -> None:
        """One optimizer step on the accumulated gradients (accelerate routes it to DeepSpeed's engine)."""
        if self.config.max_grad_norm > 0:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _minibatch_order(self, size: int) -> torch.Tensor:
        """A fresh shuffle of the rollouts for each PPO epoch (the equality test replays TRL's instead)."""
        return torch.randperm(size, generator=self.generator, device=self.generator.device)

    # ------------------------------------------------------------------ public step-wise API

    @property
    def actor_critic(self) -> ActorCritic:
        return self._actor_critic

    @property
    def policy(self):
        return self.actor_critic.policy

    @property
    def reward_funcs(self) -> list[Callable]:
        return self.rewards.funcs

    def generate(self, queries: list[list[int]], temperature: float | None = None) -> list[list[int]]:
        """Sample a response (token ids up to and including eos) for each query."""
        if self.ahead is not None:
            self.ahead.wait()  # one engine, one caller at a time: the batch in flight first
        sampled = self.sampling.completions(*self.sampling.pad(queries), temperature)
        return completion_token_ids(*trimmed(sampled, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)[:2])

    def step(self, queries: list[list[int]], responses: list[list[int]], scores) -> dict:
        """One PPO update on given rollouts and their scores (classic TRL ``step``); returns stats."""
        batch, scores = given_rollouts(queries, responses, scores, self.sampling, self.config.batch_size)
        with precision.explained_dtype_errors(self.accelerator.device):
            return self._update(*self._experience(batch, scores))

    # ------------------------------------------------------------------ the training loop

    def train(self, on_update: Callable[[int, dict], bool | None] | None = None) -> list[dict]:
        """Run ``num_updates`` updates over ``train_dataset`` in order; ``on_update(update, stats)``
        returning True stops early. Returns the per-update stats."""
        if self.train_dataset is None or not self.reward_funcs:
            raise InputError("train() needs a train_dataset and reward_funcs")
        batches = prompt_batches(self.train_dataset, self.config, self.accelerator, skip=self.update_index)
        history, cfg, total = [], self.config, num_updates(self.config, self.accelerator.num_processes)
        if self.accelerator.trackers or trackers(cfg.report_to):
            self.accelerator.init_trackers(
                "trl-ext-ppo", config={k: v for k, v in vars(cfg).items() if isinstance(v, (int, float, str, bool))}
            )
        try:
            self._train_loop(batches, total, on_update, history)
        except RolloutEngineError as err:  # the engine went away: keep what was trained, say how to go on
            if cfg.output_dir is None:
                raise
            path = self.save_checkpoint()
            raise RolloutEngineError(
                f"{err}; the run so far is saved: resume with resume_from_checkpoint={path}"
            ) from None
        finally:
            if self.ahead is not None:
                self.ahead.close()  # a rollout started for an update that will not run (an early stop, an error)
        for tracker in self.accelerator.trackers:  # not end_training(): it destroys the process group
            tracker.finish()
        return history

    def _train_loop(self, batches, total: int, on_update, history: list[dict]) -> None:
        cfg, start, rows = self.config, time.perf_counter(), next(batches)
        for update in range(self.update_index, total):
            upcoming = next(batches) if update + 1 < total else None  # max_staleness 1 rolls it out now
            stats = self.train_step(rows, upcoming)
            rows = upcoming
            stats["timing/elapsed"] = time.perf_counter() - start
            stats["eps"] = self.episode / stats["timing/elapsed"]
            history.append(stats)
            self.accelerator.log(numeric_metrics(stats), step=self.update_index)
            stop = on_update is not None and on_update(update + 1, stats)
            if cfg.save_steps and (self.update_index % cfg.save_steps == 0 or self.update_index == total or stop):
                self.save_checkpoint()
            if stop:
                break

    def _parts(self) -> dict:
        """What a checkpoint holds of this run, beside its counters."""
        return dict(
            model=self.actor_critic,
            optimizer=self.optimizer,
            scheduler=self.lr_scheduler,
            generator=self.generator,
            rank=self.accelerator.process_index,
        )

    def save_checkpoint(self) -> Path:
        """``output_dir/checkpoint-<update>``: weights, optimizer, scheduler, every rank's generators, counters."""
        if self.config.output_dir is None:
            raise InputError("save_steps needs an output_dir to write checkpoints into")
        acc, losses = self.accelerator, self.critic_warmup.value_losses
        return checkpoint.save_run(
            self.config.output_dir,
            dict(update=self.update_index, episode=self.episode, kl_coef=self.kl_coef, warmup_value_losses=losses),
            config=self.config,
            world_size=acc.num_processes,
            parts=self._parts(),
            is_main=acc.is_main_process,
            barrier=acc.wait_for_everyone,
        )

    def _load_checkpoint(self, path: Path) -> None:
        acc = self.accelerator
        saved = checkpoint.load_run(path, config=self.config, world_size=acc.num_processes, parts=self._parts())
        self.update_index, self.episode = saved["update"], saved["episode"]
        self.critic_warmup.value_losses = saved["warmup_value_losses"]  # its stopping rule goes on where it was
        if self.config.kl_target is not None:  # an adapted weight goes on; a fixed one is this run's --kl-coef
            self.kl_coef = saved["kl_coef"]

    def train_step(self, rows: dict, upcoming: dict | None = None) -> dict:
        """Rollout, reward and update for one batch of dataset rows (``input_ids`` + other columns); with
        ``max_staleness`` 1, the ``upcoming`` batch's rollout runs during the update."""
        with precision.explained_dtype_errors(self.accelerator.device):
            return self._rollout_and_update(rows, upcoming)

    def _rollout_and_update(self, rows: dict, upcoming: dict | None = None) -> dict:
        clock = PhaseClock(self.accelerator.device)
        ahead, stale = self.ahead, self.ahead is not None and self.ahead.pending
        # 1. roll out (sample, and run any environment): the batch started during the last update, or now
        batch = ahead.take() if stale else self.rollout.rollout(rows, self.sampling)
        if ahead is not None and upcoming is not None:
            self.sampling.prepare()  # the engine takes the weights as they are now, then samples on its own
            ahead.start(upcoming)
        clock.lap("generate")
        self.state.global_step = self.update_index  # 2. score, as TRL's GRPO calls reward functions
        scores, stats = self.rewards.score(
            {**rows, **batch.columns}, batch.prompts, batch.completions, batch.completion_ids, self.state
        )
        scores = torch.tensor(scores, dtype=torch.float32, device=self.accelerator.device)
        clock.lap("reward")
        experience = self._experience(batch, scores)  # 3.-5. log-probs, values, advantages
        clock.lap("experience")
        stats.update(self._update(*experience))  # 6.
        clock.lap("update")
        stats.update(rollout_metrics(batch, self.accelerator), **{"sampling/staleness": int(stale)})
        stats.update(clock.timings)
        stats["samples"] = [(p, c) for p, c in zip(batch.prompts[:2], batch.completions[:2])]
        return stats

    def _experience(self, batch: RolloutBatch, scores: torch.Tensor) -> tuple[Experience, PolicyOutput | None]:
        warming_up = self.critic_warmup.active(self.update_index)
        options = ExperienceOptions(
            self.tokenizer.eos_token_id,
            builder.needs_reference(self.config),
            self.learner.one_forward(batch.responses, warming_up),
            self.kl_coef,
            self.config.critic_warmup_lam if warming_up else None,
        )
        return make_experience(self.passes, batch, scores, self.config, options)

    def _update(self, exp: Experience, forward: PolicyOutput | None = None) -> dict:
        self.model.train()
        warming_up = self.critic_warmup.active(self.update_index)
        learner_stats = self.learner.update(exp, forward, warming_up)
        self.update_index += 1
        self.episode += len(exp) * self.accelerator.num_processes
        kl_known = builder.needs_reference(self.config)
        metrics = update_metrics(exp, learner_stats, self.accelerator, kl_known, self.critic_health)
        metrics.update(
            episode=self.episode,
            update=self.update_index,
            lr=float(self.lr_scheduler.get_last_lr()[0]),  # a tensor for torchao's
            **{"objective/kl_coef": self.kl_coef},
        )
        if warming_up:
            self.critic_warmup.record(metrics)
        # The next batch's KL weight; not after a warm-up step, whose policy has not moved (KL about 0).
        if self.config.kl_target is not None and "objective/kl" in metrics and not warming_up:
            self.kl_coef = core.adaptive_kl_coef(
                self.kl_coef,
                float(metrics["objective/kl"]),
                self.config.kl_target,
                self.config.kl_horizon,
                len(exp) * self.accelerator.num_processes,
            )
        self.lr_scheduler.step()
        return metrics

    def _stop_on_bad_loss(self, loss, epoch: int, minibatch: int) -> None:
        where = f"update {self.update_index + 1}, epoch {epoch + 1}, minibatch {minibatch + 1}"
        message = f"non-finite loss (this rank: {loss.item()}) at {where}"
        if self.config.output_dir is not None:
            # Every rank calls save(): it starts with a barrier. No optimizer step has used this
            # loss yet, so the weights are the last good ones.
            path = self.save(Path(self.config.output_dir) / "last_good")
            message += f"; the last good policy is saved in {path}"
        raise PPOError(message)

    def save(self, path: str | Path) -> Path:
        """Policy and tokenizer with ``save_pretrained``, the value head as safetensors beside them."""
        path = Path(path)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            path.mkdir(parents=True, exist_ok=True)
            self.actor_critic.save_policy(path)  # a critic adapter goes beside, with the value head
            self.tokenizer.save_pretrained(path)
            self.actor_critic.save_value_head(path)
        return path
