"""The in-house PPO trainer: the loop of seed 000's ``PPOTrainer.step``, batched, on accelerate.

One update, as the tutorials number it:
  1. generate responses for a batch of prompts (KV-cache sampling, stop at eos)
  2. score them with the reward functions
  3. log-probs of the policy (and values) and of the frozen reference (when a KL term needs it), in
     micro-batches of rows; with one optimizer step per batch and no critic, the policy's pass is the
     update's own forward (TRL's GRPO skips the no-grad pass the same way)
  4. KL-shaped rewards
  5. GAE advantages and returns, advantages whitened
  6. ``num_ppo_epochs`` x ``num_mini_batches`` clipped policy + value updates, each minibatch's
     gradient accumulated over micro-batches
Every formula is a call into ``trl_ext.ppo.core``. It does not import ``trl.experimental.ppo``:
it is trl-ext's PPO for users on TRL >= 1.13 too, and it is built like TRL's ``GRPOTrainer``
(``model``, ``reward_funcs``, ``args``, ``train_dataset``, ``processing_class``, ``peft_config``).
"""

from __future__ import annotations

import copy
import functools
import itertools
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from trl_ext.activation_checkpointing import enable_activation_checkpointing
from trl_ext.batching import pad_batch
from trl_ext.errors import TrainingError
from trl_ext.metrics import numeric_metrics
from trl_ext.ppo import checkpoint, core, losses, precision
from trl_ext.ppo.advantages import compute_advantages, needs_values
from trl_ext.ppo.config import PPOConfig, mini_batch_size, num_updates, rows_per_pass, trackers
from trl_ext.ppo.data import prepare_prompt_dataset
from trl_ext.ppo.model import ActorCritic, load_value_head
from trl_ext.ppo.rollout import Experience, completion_token_ids, positions_from_mask, response_mask
from trl_ext.ppo.samplers import Completions, SamplingOptions, build_sampler, resolve_sampler
from trl_ext.ppo.sharding import gathered_for_rollout
from trl_ext.rewards.base import call_reward, combine_rewards, place_reward, reward_name
from trl_ext.rewards.classifier import is_conversation


class PPOError(TrainingError):
    """Training cannot go on (bad model setup, non-finite loss)."""


def _disable_dropout(module: nn.Module) -> None:
    for sub in module.modules():
        if isinstance(sub, nn.Dropout):
            sub.p = 0.0


def _collate(rows: list[dict], repeats: int = 1) -> dict:
    """Columns of ``rows``, each row repeated ``repeats`` times in a row (a group of completions per prompt)."""
    rows = [row for row in rows for _ in range(repeats)]
    return {key: [row[key] for row in rows] for key in rows[0]}


def load_causal_lm(model, processing_class, dtype: str = "auto"):
    """``model`` as a module (loaded when it is a path, in ``dtype``) and its tokenizer, with pad = eos
    when it has none (as GRPO)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(model, (str, Path)):
        from trl_ext.model_dirs import read_model_config, require_architecture

        config = read_model_config(model, "policy")
        require_architecture(model, config, ("ForCausalLM", "LMHeadModel"), "policy", "causal LM")
        path, model = str(model), AutoModelForCausalLM.from_pretrained(model, dtype=precision.torch_dtype(dtype))
    else:
        path, model = getattr(model.config, "_name_or_path", None), precision.cast_model(model, dtype)
    if processing_class is None:
        if not path:
            raise PPOError("pass processing_class: the model was not loaded from a path, so its tokenizer is unknown")
        processing_class = AutoTokenizer.from_pretrained(path)
    if processing_class.eos_token_id is None:
        raise PPOError("the tokenizer has no eos token: set tokenizer.eos_token before PPO (it ends a response)")
    if processing_class.pad_token_id is None:
        processing_class.pad_token = processing_class.eos_token
    return model, processing_class


def resolve_reward_funcs(reward_funcs, dtype: str = "auto") -> list[Callable]:
    """A callable, a path to a sequence classifier (loaded in ``dtype``), or a list of them -> a list of callables."""
    from trl_ext.rewards.classifier import ClassifierReward

    if reward_funcs is None:
        return []
    items = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    resolved = []
    for item in items:
        if isinstance(item, (str, Path)):
            item = ClassifierReward.from_pretrained(item, dtype=dtype)
        if not callable(item):
            raise PPOError(f"reward_funcs holds a {type(item).__name__}: expected a callable or a path to a "
                           "sequence classifier")
        resolved.append(item)
    return resolved


def _critic_source(path: str | None):
    """The scalar reward model whose backbone and score head start the critic (``critic_init``), or None."""
    if path is None:
        return None
    from transformers import AutoModelForSequenceClassification

    from trl_ext.model_dirs import read_model_config, require_architecture

    require_architecture(path, read_model_config(path, "critic_init"), ("ForSequenceClassification",), "critic_init",
                         "sequence classifier")
    return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)


def _trainer_state(max_steps: int):
    """The ``trainer_state`` TRL's GRPO hands reward functions (for schedules on training progress)."""
    from transformers import TrainerState

    return TrainerState(max_steps=max_steps, global_step=0)


class PPOTrainer:
    """From-scratch PPO, constructed like TRL's ``GRPOTrainer``.

    ``model``: a causal LM or the path of one. ``reward_funcs``: a callable, a path to a sequence
    classifier, or a list of them, summed with ``args.reward_weights`` (``None`` rewards are left
    out, as GRPO does). ``train_dataset``: a ``prompt`` column (text or a conversation) or an
    ``input_ids`` column, plus any columns the reward functions read. ``train()`` runs the whole
    loop; ``generate`` and ``step`` are the classic step-wise API (bring your own scores).
    """

    def __init__(self, model, reward_funcs=None, args: PPOConfig | None = None, train_dataset=None,
                 processing_class=None, peft_config=None, ref_model=None, accelerator=None):
        from accelerate import Accelerator

        config = args if args is not None else PPOConfig()
        model_or_path = model
        policy, tokenizer = load_causal_lm(model, processing_class, config.dtype)
        self.config, self.tokenizer = config, tokenizer
        self.reward_funcs = resolve_reward_funcs(reward_funcs, config.dtype)
        self.reward_names = [reward_name(f) for f in self.reward_funcs]
        weights = config.reward_weights or [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise PPOError(f"reward_weights has {len(weights)} values for {len(self.reward_funcs)} reward functions")
        self.reward_weights = weights
        self.train_dataset = None if train_dataset is None else prepare_prompt_dataset(train_dataset, tokenizer)
        self.output_dir = config.output_dir
        # cpu=True without a GPU: several launched processes then form a gloo group, not N lone runs.
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available(),
                                                      log_with=trackers(config.report_to) or None,
                                                      project_dir=config.output_dir)
        torch.manual_seed(config.seed)
        self.compute_dtype = precision.model_dtype(policy)  # the checkpoint's (or --dtype's), before master weights
        precision.check_device_supports(self.compute_dtype, self.accelerator.device)
        self.vocab_size = getattr(policy.config, "vocab_size", None) or policy.get_output_embeddings().weight.shape[0]
        if peft_config is not None:
            from peft import get_peft_model

            policy = get_peft_model(policy, peft_config)
        # A PEFT policy's reference is the same model with its adapters off (seed 001): no second copy.
        if ref_model is None and hasattr(policy, "disable_adapter"):
            self.ref_policy = None
        else:
            self.ref_policy = copy.deepcopy(policy) if ref_model is None else ref_model
            self.ref_policy.eval().requires_grad_(False)
            _disable_dropout(self.ref_policy)
        if config.gradient_checkpointing:
            enable_activation_checkpointing(policy)
        model = ActorCritic(policy, separate_critic=config.separate_critic, value_head_init=config.value_head_init,
                            critic=needs_values(config), critic_source=_critic_source(config.critic_init))
        if isinstance(model_or_path, (str, Path)) and model.value_head is not None:
            load_value_head(model.value_head, model_or_path)  # continuing from a saved PPO policy
        # The reference was copied above and keeps the checkpoint's dtype; what trains becomes float32.
        precision.float32_master_weights(model, uniform=self._shards_parameters())
        _disable_dropout(model)
        self.model, self.optimizer = self._prepare(model)
        # Unwrapped once: accelerate's unwrap_model looks up installed packages on every call (ms each), and
        # its first call imports DeepSpeed where it is installed (a second), which would land in the first update.
        self._actor_critic = self.accelerator.unwrap_model(self.model)
        total = num_updates(config, self.accelerator.num_processes)
        decay = (lambda step: max(0.0, 1.0 - step / total)) if config.lr_scheduler_type == "linear" else \
            (lambda step: 1.0)
        # Stepped once per update, as TRL does: lr falls linearly to 0 at the end of the run.
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(getattr(self.optimizer, "optimizer", self.optimizer),
                                                              decay)
        device = self.accelerator.device
        if self.ref_policy is not None:
            self.ref_policy.to(device)
        for fn in self.reward_funcs:  # a reward model scores where the policy runs
            place_reward(fn, device)
        self.sampler_name = resolve_sampler(config.sampler, device)
        self.sampler = build_sampler(self.sampler_name, config)
        self.generator = torch.Generator(device=device).manual_seed(
            config.seed + 100003 * self.accelerator.process_index)
        self.episode, self.update_index = 0, 0
        self.state = _trainer_state(total)
        self._logged: dict[str, list[float]] = {}
        self.resumed_from = None
        if config.resume_from_checkpoint:  # checked now, before anything is written
            self.resumed_from = checkpoint.resolve(config.resume_from_checkpoint, config.output_dir)
            self._load_checkpoint(self.resumed_from)

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

    def _backward(self, loss: torch.Tensor) -> None:
        """Gradients of one micro-batch's share of the loss, added to those of the minibatch's others."""
        self.accelerator.backward(loss)

    def _optimizer_step(self) -> None:
        """One optimizer step on the accumulated gradients (accelerate routes it to DeepSpeed's engine)."""
        if self.config.max_grad_norm > 0:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.sampler.policy_changed()  # an engine with its own copy of the weights syncs before the next rollout

    def _optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        # TRL's optimizer settings (no weight decay, eps 1e-8), so the backends differ in the loop only.
        trainable = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(trainable, lr=self.config.learning_rate, eps=1e-8, weight_decay=0.0, foreach=True)

    # ------------------------------------------------------------------ public step-wise API

    @property
    def actor_critic(self) -> ActorCritic:
        return self._actor_critic

    @property
    def policy(self):
        return self.actor_critic.policy

    def generate(self, queries: list[list[int]], temperature: float | None = None) -> list[list[int]]:
        """Sample a response (token ids up to and including eos) for each query."""
        query_ids, query_mask = self._pad_queries(queries)
        responses = self._sample(query_ids, query_mask, temperature).ids
        mask = response_mask(responses, self.tokenizer.eos_token_id)
        return [row[: int(m.sum())].tolist() for row, m in zip(responses, mask)]

    def step(self, queries: list[list[int]], responses: list[list[int]], scores) -> dict:
        """One PPO update on given rollouts and their scores (classic TRL ``step``); returns stats."""
        if not (len(queries) == len(responses) == len(scores)):
            raise PPOError(f"step needs as many queries, responses and scores (got {len(queries)}, "
                           f"{len(responses)}, {len(scores)})")
        if len(queries) != self.config.batch_size:
            raise PPOError(f"step expects batch_size={self.config.batch_size} rollouts, got {len(queries)}")
        if any(len(r) == 0 for r in responses):
            raise PPOError("every response needs at least one token")
        query_ids, query_mask = self._pad_queries(queries)
        device = self.accelerator.device
        response_ids, padding = pad_batch(responses, self.tokenizer.pad_token_id, side="right")
        response_ids = response_ids.to(device)
        # A response ends at its first eos or at its own length, whichever comes first.
        mask = response_mask(response_ids, self.tokenizer.eos_token_id) * padding.to(device)
        scores = torch.as_tensor([float(s) for s in scores], dtype=torch.float32, device=device)
        if not torch.isfinite(scores).all():
            raise PPOError(f"non-finite score at index {int((~torch.isfinite(scores)).nonzero()[0])}")
        with precision.explained_dtype_errors(device):
            return self._update(self._experience(query_ids, query_mask, response_ids, mask, scores))

    # ------------------------------------------------------------------ the training loop

    def train(self, on_update: Callable[[int, dict], bool | None] | None = None) -> list[dict]:
        """Run ``num_updates`` updates over ``train_dataset`` in order; ``on_update(update, stats)``
        returning True stops early. Returns the per-update stats."""
        if self.train_dataset is None or not self.reward_funcs:
            raise PPOError("train() needs a train_dataset and reward_funcs")
        from torch.utils.data import DataLoader

        prompts_per_batch = self.config.batch_size // self.config.num_generations
        loader = self.accelerator.prepare(DataLoader(
            self.train_dataset, batch_size=prompts_per_batch, shuffle=False, drop_last=True,
            collate_fn=functools.partial(_collate, repeats=self.config.num_generations)))
        if len(loader) == 0:
            raise PPOError(f"train_dataset of {len(self.train_dataset)} rows is smaller than one batch")
        history = []

        def batches():
            while True:
                yield from loader

        cfg, total = self.config, num_updates(self.config, self.accelerator.num_processes)
        if self.accelerator.trackers or trackers(cfg.report_to):
            self.accelerator.init_trackers("trl-ext-ppo", config={k: v for k, v in vars(cfg).items()
                                                                  if isinstance(v, (int, float, str, bool))})
        start = time.perf_counter()
        # Prompts are read in order, so a resumed run skips the batches its checkpoint had used.
        remaining = itertools.islice(batches(), self.update_index, None)
        for update, rows in zip(range(self.update_index, total), remaining):
            stats = self.train_step(rows)
            stats["timing/elapsed"] = time.perf_counter() - start
            stats["eps"] = self.episode / stats["timing/elapsed"]
            history.append(stats)
            self.accelerator.log(numeric_metrics(stats), step=self.update_index)
            stop = on_update is not None and on_update(update + 1, stats)
            if cfg.save_steps and (self.update_index % cfg.save_steps == 0 or self.update_index == total or stop):
                self.save_checkpoint()
            if stop:
                break
        for tracker in self.accelerator.trackers:  # not end_training(): it destroys the process group
            tracker.finish()
        return history

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_state(self) -> dict:
        return {"update": self.update_index, "episode": self.episode,
                "fingerprint": checkpoint.fingerprint(self.actor_critic, self.config, self.accelerator.num_processes)}

    def save_checkpoint(self) -> Path:
        """``output_dir/checkpoint-<update>``: weights, optimizer, scheduler, every rank's generators, counters."""
        if self.output_dir is None:
            raise PPOError("save_steps needs an output_dir to write checkpoints into")
        acc = self.accelerator
        path = checkpoint.save(Path(self.output_dir) / f"{checkpoint.PREFIX}{self.update_index}",
                               model=self.actor_critic, optimizer=self.optimizer, scheduler=self.lr_scheduler,
                               generator=self.generator, state=self._checkpoint_state(),
                               is_main=acc.is_main_process, rank=acc.process_index, barrier=acc.wait_for_everyone)
        if self.config.save_total_limit and acc.is_main_process:
            checkpoint.rotate(self.output_dir, self.config.save_total_limit)
        acc.wait_for_everyone()
        return path

    def _load_checkpoint(self, path: Path) -> None:
        saved = checkpoint.read_state(path)
        checkpoint.check_fits(saved["fingerprint"], self._checkpoint_state()["fingerprint"], path)
        state = checkpoint.load(path, model=self.actor_critic, optimizer=self.optimizer, scheduler=self.lr_scheduler,
                                generator=self.generator, rank=self.accelerator.process_index)
        self.update_index, self.episode = state["update"], state["episode"]

    def train_step(self, rows: dict) -> dict:
        """Rollout, reward and update for one batch of dataset rows (``input_ids`` + other columns)."""
        with precision.explained_dtype_errors(self.accelerator.device):
            return self._train_step(rows)

    def _train_step(self, rows: dict) -> dict:
        timings, tick = {}, self._clock()

        def lap(name: str) -> None:  # phases end to end: their sum is the step's wall time
            nonlocal tick
            now = self._clock()
            timings[f"timing/{name}"], tick = now - tick, now

        query_ids, query_mask = self._pad_queries(rows["input_ids"])
        sampled = self._sample(query_ids, query_mask)
        lap("generate")
        mask = response_mask(sampled.ids, self.tokenizer.eos_token_id)
        width = int(mask.sum(1).max())  # columns past it are padding in every row: drop them, later passes cost less
        mask = mask[:, :width]
        responses = sampled.ids[:, :width].masked_fill(mask == 0, self.tokenizer.pad_token_id)
        sampling_logprobs = None if sampled.logprobs is None else sampled.logprobs[:, :width] * mask
        prompts = rows.get("prompt") or self.tokenizer.batch_decode(rows["input_ids"])
        completion_ids = completion_token_ids(responses, mask)
        completions = self._completions(prompts, completion_ids)
        scores, reward_stats = self._score(rows, prompts, completions, completion_ids)
        lap("reward")
        experience = self._experience(query_ids, query_mask, responses, mask, scores, sampling_logprobs)
        lap("experience")
        stats = self._update(experience)
        lap("update")
        stats.update(reward_stats)
        stats.update(timings)
        stats["samples"] = [(p, c) for p, c in zip(prompts[:2], completions[:2])]
        return stats

    # ------------------------------------------------------------------ rewards

    def _completions(self, prompts: list, completion_ids: list[list[int]]) -> list:
        """Completions in the form TRL's GRPO hands them: text, or one assistant message for conversations."""
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=self.config.skip_special_tokens)
        if is_conversation(prompts[0]):
            return [[{"role": "assistant", "content": text}] for text in texts]
        return texts

    def _score(self, rows: dict, prompts: list, completions: list, completion_ids: list[list[int]]):
        """Every reward function called as GRPO calls it; their weighted sum (GRPO's None rule) as a tensor."""
        columns = {k: v for k, v in rows.items() if k not in ("input_ids", "attention_mask", "prompt")}
        self.state.global_step = self.update_index
        kwargs = dict(columns, completion_ids=completion_ids, trainer_state=self.state,
                      log_metric=self._log_metric, log_extra=self._log_extra)
        per_function = [call_reward(fn, prompts, completions, allow_none=True, **kwargs) for fn in self.reward_funcs]
        scores = combine_rewards(per_function, self.reward_weights, self.reward_names, prompts)
        stats = {}
        for name, values in zip(self.reward_names, per_function):
            scored = [v for v in values if v is not None]
            if scored:
                stats[f"rewards/{name}/mean"] = sum(scored) / len(scored)
        for name, values in self._logged.items():
            stats[name] = sum(values) / len(values)
        self._logged = {}
        return torch.tensor(scores, dtype=torch.float32, device=self.accelerator.device), stats

    def _log_metric(self, name: str, value: float) -> None:
        """``log_metric`` for reward functions (GRPO's keyword): averaged into this update's stats."""
        self._logged.setdefault(name, []).append(float(value))

    def _log_extra(self, column: str, values: Sequence) -> None:
        """``log_extra`` for reward functions (GRPO's keyword): numeric values are averaged into
        ``extra/COLUMN``; there is no completions table here, so text values are not kept."""
        numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numbers:
            self._logged.setdefault(f"extra/{column}", []).extend(numbers)

    # ------------------------------------------------------------------ internals

    def _clock(self) -> float:
        """Seconds now, after the GPU finished its queued work: phases timed so add up to the wall clock."""
        if self.accelerator.device.type == "cuda":
            torch.cuda.synchronize(self.accelerator.device)
        return time.perf_counter()

    def _pad_queries(self, queries) -> tuple[torch.Tensor, torch.Tensor]:
        if len(queries) == 0 or any(len(q) == 0 for q in queries):
            raise PPOError("every query needs at least one token")
        ids, mask = pad_batch([list(q) for q in queries], self.tokenizer.pad_token_id, side="left")
        return ids.to(self.accelerator.device), mask.to(self.accelerator.device)

    def _sample(self, query_ids, query_mask, temperature: float | None = None) -> Completions:
        cfg, policy = self.config, self.policy
        was_training = policy.training
        policy.eval()
        options = SamplingOptions(max_new_tokens=cfg.response_length, eos_token_id=self.tokenizer.eos_token_id,
                                  pad_token_id=self.tokenizer.pad_token_id, top_k=cfg.top_k, top_p=cfg.top_p,
                                  temperature=cfg.temperature if temperature is None else temperature,
                                  repetition_penalty=cfg.repetition_penalty)
        try:
            with gathered_for_rollout(self.model), self.accelerator.autocast():
                return self.sampler.sample(policy, query_ids, query_mask, options, generator=self.generator)
        finally:
            policy.train(was_training)

    def _logits_to_keep(self, responses: torch.Tensor) -> int:
        """Logits of the positions that predict response tokens (and the last one, dropped): no prompt logits."""
        return responses.shape[1] + 1

    def _forward_rows(self, option: int, batch: int, responses: torch.Tensor) -> int:
        return rows_per_pass(option, batch, self._logits_to_keep(responses), self.vocab_size)

    def _reference_logits(self, query_response, attention_mask, position_ids, logits_to_keep: int = 0) -> torch.Tensor:
        inputs = dict(input_ids=query_response, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False, logits_to_keep=logits_to_keep)
        with self.accelerator.autocast():
            if self.ref_policy is not None:
                return self.ref_policy(**inputs).logits
            # The base model under the LoRA adapters is the reference; the policy is a child of the
            # (maybe sharded) root, so its parameters are gathered for the call.
            with gathered_for_rollout(self.model), self.policy.disable_adapter():
                return self.policy(**inputs).logits

    def _needs_reference(self) -> bool:
        """Whether any KL to the reference enters the run (``kl_coef`` in the reward, ``beta`` in the loss)."""
        return self.config.kl_coef > 0 or self.config.beta > 0

    def _one_forward_update(self, responses: torch.Tensor) -> bool:
        """Whether the update is one forward pass and one optimizer step over the whole batch: one PPO epoch of
        one minibatch, one micro-batch, no critic. The policy that pass sees is then the one that sampled, so
        (as TRL's GRPO with ``num_iterations=1``) the old log-probs are its own, detached (ratio 1): the
        experience phase runs it, with gradients, instead of a no-grad pass of its own, and the KL in the reward
        and the advantages read it."""
        cfg, batch = self.config, len(responses)
        return (cfg.num_ppo_epochs == 1 and cfg.num_mini_batches == 1 and not needs_values(cfg)
                and self._micro_batch_rows(batch, responses) >= batch)

    @torch.no_grad()
    def _experience(self, query_ids, query_mask, responses, mask, scores, sampling_logprobs=None) -> Experience:
        cfg = self.config
        query_response = torch.cat([query_ids, responses], dim=1)
        attention_mask = torch.cat([query_mask.long(), mask], dim=1)
        position_ids = positions_from_mask(attention_mask)
        inputs = (query_response, attention_mask, position_ids)
        # The reference first: a policy pass that is the update's keeps its graph until the backward.
        ref_logprobs = self._reference_logprobs(inputs, responses) if self._needs_reference() else None
        logprobs = entropy = values = None
        if self._one_forward_update(responses):
            self.model.train()
            with torch.enable_grad():
                logprobs, entropy, _ = self._policy_forward(*inputs, responses)
            old_logprobs = logprobs.detach()
        else:
            old_logprobs, values = self._old_policy_pass(inputs, responses)
        if ref_logprobs is None:  # no KL term anywhere: KL 0, as if the reference were the policy
            ref_logprobs = old_logprobs
        ended = (responses == self.tokenizer.eos_token_id).logical_and(mask.bool()).any(-1)
        group_ids = torch.arange(len(responses), device=responses.device) // cfg.num_generations
        result = compute_advantages(scores, old_logprobs, ref_logprobs, values, mask, ended, group_ids, cfg)
        weights = None
        if sampling_logprobs is not None and cfg.vllm_importance_sampling_correction:
            weights = core.importance_sampling_weights(
                old_logprobs, sampling_logprobs, mask, cfg.vllm_importance_sampling_mode,
                cfg.vllm_importance_sampling_clip_min, cfg.vllm_importance_sampling_clip_max)
        return Experience(
            query_response=query_response, attention_mask=attention_mask, position_ids=position_ids,
            responses=responses, mask=mask, value_mask=result.value_mask, old_logprobs=old_logprobs,
            ref_logprobs=ref_logprobs, old_values=result.values, scores=result.scores, rewards=result.rewards,
            non_score_rewards=result.non_score_rewards, kl=result.kl, advantages=result.advantages,
            returns=result.returns, logprobs=logprobs, entropy=entropy, sampling_logprobs=sampling_logprobs,
            importance_weights=weights,
        )

    def _experience_parts(self, responses: torch.Tensor) -> list[slice]:
        """Rows of the experience passes, so that one pass's logits stay within the budget whatever the batch."""
        rows = self._forward_rows(self.config.local_rollout_forward_batch_size, len(responses), responses)
        return [slice(start, start + rows) for start in range(0, len(responses), rows)]

    def _old_policy_pass(self, inputs, responses) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of the policy before the update and the critic's values (None without one), no gradients."""
        length, keep = inputs[0].shape[1] - responses.shape[1], self._logits_to_keep(responses)
        old_logprobs, values = [], []
        for part in self._experience_parts(responses):
            with self.accelerator.autocast():
                logits, part_values = self.model(*(x[part] for x in inputs), logits_to_keep=keep)
            old_logprobs.append(core.logprobs_from_logits(logits[:, :-1], responses[part], self.config.temperature))
            del logits  # before the next pass's own logits exist
            if part_values is not None:
                values.append(part_values[:, length - 1:-1].float())
        return torch.cat(old_logprobs), torch.cat(values) if values else None

    def _reference_logprobs(self, inputs, responses) -> torch.Tensor:
        keep, logprobs = self._logits_to_keep(responses), []
        for part in self._experience_parts(responses):
            ref_logits = self._reference_logits(*(x[part] for x in inputs), logits_to_keep=keep)
            logprobs.append(core.logprobs_from_logits(ref_logits[:, :-1], responses[part], self.config.temperature))
            del ref_logits
        return torch.cat(logprobs)

    def _policy_forward(self, query_response, attention_mask, position_ids, responses, critic_only: bool = False):
        """The update's forward pass: log-probs of ``responses`` (B, R) with their graph, the policy's entropy
        per token (B, R) (with its graph when ``ent_coef > 0``), and values (B, L) or None without a critic."""
        cfg = self.config
        with self.accelerator.autocast():  # bf16/fp16 forward; log-probs, KL and losses stay float32
            logits, values = self.model(query_response, attention_mask, position_ids,
                                        logits_to_keep=self._logits_to_keep(responses), critic_only=critic_only)
        response_logits = logits[:, :-1]
        logprobs = core.logprobs_from_logits(response_logits, responses, cfg.temperature)
        with torch.set_grad_enabled(cfg.ent_coef > 0):
            entropy = core.entropy_from_logits(response_logits, cfg.temperature)
        return logprobs, entropy, values

    def _update(self, exp: Experience) -> dict:
        cfg = self.config
        size = mini_batch_size(cfg)
        stats: dict[str, list[torch.Tensor]] = {}  # name -> one value per (epoch, minibatch)
        self.model.train()
        for epoch in range(cfg.num_ppo_epochs):
            order = self._minibatch_order(len(exp))
            for mb_index in range(cfg.num_mini_batches):
                mb = exp.minibatch(order[mb_index * size:(mb_index + 1) * size].to(exp.mask.device))
                mb_stats: dict[str, torch.Tensor] = {}
                for micro in self._micro_batches(mb):
                    loss, micro_stats = self._micro_batch_loss(micro, mb, exp.query_length)
                    if self._any_rank_non_finite(loss):
                        self._stop_on_bad_loss(loss, epoch, mb_index)
                    self._backward(loss)
                    for name, value in micro_stats.items():  # each already weighted by its share
                        mb_stats[name] = mb_stats.get(name, 0.0) + value.detach()
                self._optimizer_step()
                for name, value in mb_stats.items():
                    stats.setdefault(name, []).append(value)
        self.update_index += 1
        self.episode += len(exp) * self.accelerator.num_processes
        metrics = self._metrics(exp, {name: torch.stack(values).mean() for name, values in stats.items()})
        metrics["lr"] = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        return metrics

    def _micro_batch_rows(self, batch: int, responses: torch.Tensor) -> int:
        """Rows of an update micro-batch: ``micro_batch_size`` (auto: the logits budget). DeepSpeed's engine
        steps on every backward that accelerate routes to it, so under DeepSpeed a minibatch is one micro-batch."""
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            return batch
        return self._forward_rows(self.config.micro_batch_size, batch, responses)

    def _micro_batches(self, mb: Experience) -> list[Experience]:
        """``mb`` in rows of ``_micro_batch_rows``."""
        rows = self._micro_batch_rows(len(mb), mb.responses)
        if rows >= len(mb):
            return [mb]
        return [mb.minibatch(torch.arange(start, min(start + rows, len(mb)), device=mb.mask.device))
                for start in range(0, len(mb), rows)]

    def _micro_batch_loss(self, micro: Experience, mb: Experience, query_length: int):
        """The loss of ``micro`` weighted by its share of minibatch ``mb`` (so the accumulated gradient is
        the minibatch's), and its stats weighted likewise (they sum to the minibatch's)."""
        cfg = self.config
        warming_up = self.update_index < cfg.critic_warmup_steps  # the value function alone learns
        if micro.logprobs is None:
            logprobs, entropy, values = self._policy_forward(micro.query_response, micro.attention_mask,
                                                             micro.position_ids, micro.responses, warming_up)
        else:  # the experience phase ran this forward (_one_forward_update)
            logprobs, entropy, values = micro.logprobs, micro.entropy, None
        pg_loss, pg = losses.policy_loss(logprobs, micro.old_logprobs, micro.ref_logprobs, micro.advantages,
                                         micro.mask, cfg, micro.importance_weights)
        tokens = losses.share("tokens", micro.mask, mb.mask)
        pg_share = losses.share(losses.LOSS_AGGREGATIONS[cfg.loss_type].normaliser, micro.mask, mb.mask)
        pg_stats_share = losses.share(losses.POLICY_LOSSES[cfg.policy_loss].stats_over, micro.mask, mb.mask)
        entropy = core.masked_mean(entropy, micro.mask)
        loss = pg_share * pg_loss - cfg.ent_coef * tokens * entropy
        if warming_up:  # stats as usual, but no policy term in the loss
            loss = pg_loss.new_zeros(())
        stats = {"loss/policy_avg": pg_share * pg_loss, "policy/clipfrac_avg": pg_stats_share * pg["clipfrac"],
                 "policy/approxkl_avg": pg_stats_share * pg["approxkl"], "val/ratio": pg_stats_share * pg["ratio"],
                 "policy/entropy_avg": tokens * entropy}
        if "kl_loss" in pg:
            stats["loss/kl_avg"] = tokens * pg["kl_loss"]
        if values is not None:  # a critic-free estimator trains no value function
            new_values = values[:, query_length - 1:-1].float()
            vf_loss, vf = core.clipped_value_loss(new_values, micro.old_values, micro.returns, micro.value_mask,
                                                  cfg.cliprange_value)
            value_share = losses.share("tokens", micro.value_mask, mb.value_mask)
            loss = loss + cfg.vf_coef * value_share * vf_loss
            stats.update({"loss/value_avg": value_share * vf_loss, "val/clipfrac_avg": value_share * vf["clipfrac"]})
        return loss, stats

    def _minibatch_order(self, size: int) -> torch.Tensor:
        """A fresh shuffle of the rollouts for each PPO epoch (the equality test replays TRL's instead)."""
        return torch.randperm(size, generator=self.generator, device=self.generator.device)

    def _metrics(self, exp: Experience, update_stats: dict[str, torch.Tensor]) -> dict:
        """Per-rollout objectives and the update's averaged stats, by name, averaged over processes."""
        local = {
            "objective/kl": exp.kl.sum(1).mean(),
            "objective/entropy": (-exp.old_logprobs * exp.mask).sum(1).mean(),
            "objective/non_score_reward": exp.non_score_rewards.sum(1).mean(),
            "objective/scores": exp.scores.mean(),
            "val/response_length": exp.mask.sum(1).float().mean(),
            **update_stats,
        }
        if not self._needs_reference():  # no KL term: the reference did not run, its KL is not known
            del local["objective/kl"]
        names = list(local)
        gathered = self.accelerator.gather_for_metrics(torch.stack([local[n].float() for n in names])[None])
        metrics = dict(zip(names, gathered.mean(0).tolist()))
        metrics["objective/rlhf_reward"] = metrics["objective/scores"] + metrics["objective/non_score_reward"]
        if exp.sampling_logprobs is not None:
            metrics.update(self._sampling_metrics(exp))
        metrics["episode"] = self.episode
        metrics["update"] = self.update_index
        return metrics

    def _sampling_metrics(self, exp: Experience) -> dict:
        """How far the rollout engine's log-probs of its samples are from the trainer's (TRL GRPO's names), and
        the importance weights that correct for it; means averaged over processes, extremes taken over them."""
        mask = exp.mask.bool()
        gap = (exp.old_logprobs - exp.sampling_logprobs).abs()[mask]
        stats = {"sampling/sampling_logp_difference/mean": (gap.mean(), "mean"),
                 "sampling/sampling_logp_difference/max": (gap.max(), "max")}
        if exp.importance_weights is not None:
            weights = exp.importance_weights
            weights = weights.flatten() if weights.shape[1] == 1 else weights[mask]
            stats.update({"sampling/importance_sampling_ratio/min": (weights.min(), "min"),
                          "sampling/importance_sampling_ratio/mean": (weights.mean(), "mean"),
                          "sampling/importance_sampling_ratio/max": (weights.max(), "max")})
        names = list(stats)
        gathered = self.accelerator.gather(torch.stack([stats[n][0].float() for n in names])[None])
        reduce = {"mean": torch.mean, "max": torch.amax, "min": torch.amin}
        return {n: reduce[stats[n][1]](gathered[:, i]).item() for i, n in enumerate(names)}

    def _any_rank_non_finite(self, loss: torch.Tensor) -> bool:
        """True on every rank when the loss of any rank is not finite, so that all of them stop together."""
        bad = (~torch.isfinite(loss.detach())).float().reshape(1)
        if self.accelerator.num_processes > 1:
            bad = self.accelerator.reduce(bad, reduction="sum")
        return bool(bad.item() > 0)

    def _stop_on_bad_loss(self, loss, epoch: int, minibatch: int) -> None:
        where = f"update {self.update_index + 1}, epoch {epoch + 1}, minibatch {minibatch + 1}"
        message = f"non-finite loss (this rank: {loss.item()}) at {where}"
        if self.output_dir is not None:
            # Every rank calls save(): it starts with a barrier. No optimizer step has used this
            # loss yet, so the weights are the last good ones.
            path = self.save(Path(self.output_dir) / "last_good")
            message += f"; the last good policy is saved in {path}"
        raise PPOError(message)

    def save(self, path: str | Path) -> Path:
        """Policy and tokenizer with ``save_pretrained``, the value head as safetensors beside them."""
        path = Path(path)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            path.mkdir(parents=True, exist_ok=True)
            self.policy.save_pretrained(path, safe_serialization=True)
            self.tokenizer.save_pretrained(path)
            self.actor_critic.save_value_head(path)
        return path
