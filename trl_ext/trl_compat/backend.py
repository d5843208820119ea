"""Launch TRL's own ``PPOTrainer`` (``trl.experimental.ppo``, TRL <= 1.12) on our pieces.

TRL's PPO reads both the reward model and the value model through ``base_model_prefix``
and ``score``. The reward is a reward function behind ``as_ppo_reward_model``; the value model
is TRL's ``AutoModelForCausalLMWithValueHead`` presented the same way: its backbone is the
policy's own transformer (shared) or a copy of it (separate), as our ``ActorCritic`` has it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from trl_ext.errors import InputError
from trl_ext.models.activation_checkpointing import checkpointing_training_argument, enable_activation_checkpointing
from trl_ext.ppo.model import base_backbone
from trl_ext.ppo.optimizers import optimizer_training_argument
from trl_ext.ppo.precision import launch_training_arguments
from trl_ext.rewards.base import place_reward
from trl_ext.trl_compat.reward_model import as_ppo_reward_model


class ValueModelView(nn.Module):
    """``AutoModelForCausalLMWithValueHead`` in the shape TRL's PPO reads: ``backbone`` + ``score``."""

    base_model_prefix = "backbone"

    def __init__(self, with_value_head):
        super().__init__()
        self.with_value_head = with_value_head
        self.backbone = base_backbone(with_value_head.pretrained_model)

    def score(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.with_value_head.v_head(hidden_states)


def build_value_model(policy, separate_critic: bool, value_head_init: str = "linear") -> ValueModelView:
    from trl.experimental.ppo import AutoModelForCausalLMWithValueHead

    base = copy.deepcopy(policy) if separate_critic else policy
    view = ValueModelView(AutoModelForCausalLMWithValueHead(base))
    if value_head_init == "zero":  # TRL's own is nn.Linear's init ('linear')
        nn.init.zeros_(view.with_value_head.v_head.summary.weight)
        nn.init.zeros_(view.with_value_head.v_head.summary.bias)
    return view


# Options whose name and meaning are the same in our PPOConfig and TRL's.
SHARED_WITH_TRL = (
    "learning_rate",
    "lr_scheduler_type",
    "num_mini_batches",
    "num_ppo_epochs",
    "total_episodes",
    "kl_coef",
    "kl_estimator",
    "cliprange",
    "cliprange_value",
    "vf_coef",
    "gamma",
    "lam",
    "whiten_rewards",
    "response_length",
    "temperature",
    "seed",
    "missing_eos_penalty",
)


# What TRL 1.12's PPO does where our PPOConfig has a choice: a run of ours with another value is not TRL's method.
TRL_PPO_FIXED = {
    "advantage_estimator": "gae",
    "score_position": "after_last_token",
    "kl_mode": "token",
    "policy_loss": "clip",
    "loss_type": "bnpo",  # the token losses' mean over the minibatch
    "beta": 0.0,
    "ent_coef": 0.0,
    "max_grad_norm": 0.0,
    "whiten_advantages": True,
    # its rollouts: GenerationConfig(top_k=0, top_p=1.0), no repetition penalty
    "top_k": 0,
    "top_p": 1.0,
    "repetition_penalty": 1.0,
}


# The options of our config that build_trl_trainer and the runner read besides those (tests/test_trl_reads.py
# records them): any other a user sets would change nothing in TRL's run.
TRL_PPO_READS = frozenset(
    (
        *SHARED_WITH_TRL,
        "output_dir",
        "batch_size",
        "optim",
        "gradient_checkpointing",
        "save_steps",
        "save_total_limit",
        "report_to",
        "separate_critic",
        "value_head_init",
        "skip_special_tokens",  # how the reward adapter decodes completions, as our trainer does
    )
)


def trl_ppo_config(cfg, output_dir: str | Path):
    """Our ``PPOConfig`` -> TRL's, with the CPU-safe settings TRL's defaults get wrong."""
    from trl.experimental.ppo import PPOConfig as TRLPPOConfig

    same_meaning = {name: getattr(cfg, name) for name in SHARED_WITH_TRL}
    return TRLPPOConfig(
        output_dir=str(output_dir),
        **same_meaning,
        per_device_train_batch_size=cfg.batch_size,
        local_rollout_forward_batch_size=cfg.batch_size,
        gradient_accumulation_steps=1,
        stop_token="eos",
        **launch_training_arguments(),  # the launch's mixed precision and device
        **checkpointing_training_argument(cfg.gradient_checkpointing),  # recorded: train() never reads it
        **optimizer_training_argument(cfg.optim),
        num_sample_generations=0,
        save_strategy="steps" if cfg.save_steps else "no",
        save_steps=cfg.save_steps or 500,
        save_total_limit=cfg.save_total_limit or None,
        report_to=cfg.report_to,
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def pad_outside_queries(tokenizer, queries):
    """``tokenizer``, or a copy whose pad token occurs in none of ``queries`` (lists of ids).

    TRL 1.12's PPO drops every pad id from a query (``query != pad_token_id``). A chat model padded with its eos
    (SmolLM2, Qwen: ``<|im_end|>``) writes that id at the end of every turn of a chat prompt, so TRL would cut
    the turns apart. The copy pads with the first special token no query holds; eos still ends responses.
    """
    pad = tokenizer.pad_token_id
    present = {t for q in queries for t in q}
    if pad not in present:
        return tokenizer
    spare = [
        t
        for t in tokenizer.all_special_tokens
        if tokenizer.convert_tokens_to_ids(t) not in present and t != tokenizer.eos_token
    ]
    if not spare:
        raise InputError(
            f"TRL 1.12's PPO drops the pad token from queries, and the pad token "
            f"{tokenizer.pad_token!r} occurs in the prompts; the tokenizer has no other special token "
            "to pad with: add one (tokenizer.add_special_tokens) or use --backend scratch"
        )
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.pad_token = spare[0]
    return tokenizer


def left_padded(tokenizer):
    """``tokenizer``, or a copy that pads on the left, so the user's own object is left as it was.

    TRL 1.12's PPO pads its queries with the tokenizer's collator, whatever side that pads on, and generates right
    after them. After right padding, transformers' generate numbers the response from the last column's position
    (a pad's, 0) while TRL's forward passes number it from the prompt's length: the rollout's log-probs and the
    reference's differ before any step (6-12 nats an answer on SmolLM2 with policy == reference).
    """
    if tokenizer.padding_side == "left":
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.padding_side = "left"
    return tokenizer


def build_trl_trainer(cfg, policy, tokenizer, reward_fn, train_dataset, output_dir, callbacks=(), peft_config=None):
    """A ready ``trl.experimental.ppo.PPOTrainer`` that visits ``train_dataset`` in order.

    ``train_dataset`` holds ``input_ids`` plus any columns the reward function reads (``label``...);
    TRL's loader sees only ``input_ids``, the reward adapter sees the rest through its prompt index.
    With ``peft_config`` TRL wraps the policy in LoRA and uses it, adapter disabled, as the reference.
    """
    from torch.utils.data import DataLoader
    from transformers import PrinterCallback, ProgressCallback
    from trl.experimental.ppo import PPOTrainer as TRLPPOTrainer

    if cfg.kl_mode != "token":
        raise InputError("TRL's PPO shapes rewards per token only: kl_mode must be 'token' for the trl backend")
    if cfg.ent_coef:
        raise InputError("TRL's PPO has no entropy bonus: ent_coef must be 0 for the trl backend")
    if cfg.resume_from_checkpoint:
        raise InputError("TRL 1.12's PPOTrainer cannot resume: its train() takes no checkpoint")
    if cfg.critic_adapter:
        raise InputError(
            "TRL 1.12's PPO has no critic adapter (its value model is a separate model): "
            "critic_adapter needs the scratch backend"
        )
    if cfg.chunked_lm_head:
        raise InputError("TRL 1.12's PPO computes whole logits: chunked_lm_head needs the scratch backend")
    # transformers' Trainer seeds python, numpy and torch in its __init__; TRL 1.12's PPOTrainer skips
    # that __init__ and shuffles minibatches with the global numpy RNG, so without this a run cannot
    # be repeated (measured: sampled exact 0.977 in one run, 0.992 in the next, same seed).
    from transformers import set_seed

    set_seed(cfg.seed)
    if cfg.gradient_checkpointing:  # TRL 1.12's PPOTrainer.train() never enables it from its arguments
        enable_activation_checkpointing(policy)
    tokenizer = pad_outside_queries(left_padded(tokenizer), train_dataset["input_ids"])
    reward_model = as_ppo_reward_model(reward_fn, tokenizer, train_dataset, cfg.skip_special_tokens)
    value_model = build_value_model(policy, cfg.separate_critic, cfg.value_head_init)
    ids_only = train_dataset.select_columns(["input_ids"])
    trainer = TRLPPOTrainer(
        args=trl_ppo_config(cfg, output_dir),
        processing_class=tokenizer,
        model=policy,
        ref_model=None if peft_config is not None else copy.deepcopy(policy),
        reward_model=reward_model,
        value_model=value_model,
        peft_config=peft_config,
        train_dataset=ids_only,
        eval_dataset=ids_only.select(range(min(len(ids_only), cfg.batch_size))),
        callbacks=list(callbacks),
    )
    place_reward(reward_fn, trainer.accelerator.device)
    # Quiet by default: our recorder prints a short line now and then instead of every log dict.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    # Same prompts in the same order as the scratch trainer: TRL would reshuffle with its own RNG.
    trainer.dataloader = trainer.accelerator.prepare(
        DataLoader(ids_only, batch_size=cfg.batch_size, shuffle=False, collate_fn=trainer.data_collator, drop_last=True)
    )
    return trainer


def save_trl_policy(trainer, tokenizer, path: str | Path) -> Path:
    """The tuned policy and tokenizer with ``save_pretrained``; TRL's value head as safetensors beside them."""
    from trl_ext.ppo.model import save_value_head

    path = Path(path)
    trainer.accelerator.wait_for_everyone()
    if trainer.accelerator.is_main_process:
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        unwrapped.policy.save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)
        save_value_head(unwrapped.value_model.with_value_head.v_head.summary, path)
    return path
