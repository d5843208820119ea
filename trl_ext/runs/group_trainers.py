"""TRL's GRPO and RLOO, driven by the very same reward-function object as trl-ext's PPO.

They are the critic-free rows of a comparison (``trl-ext compare``, the benchmarks): policy-gradient baselines
with the same policy, prompts, reward and episode budget as the PPO rows.
"""

from __future__ import annotations

from pathlib import Path

from trl_ext.errors import InputError
from trl_ext.models.activation_checkpointing import checkpointing_training_argument
from trl_ext.ppo.optimizers import optimizer_training_argument
from trl_ext.ppo.precision import launch_training_arguments
from trl_ext.rewards.base import place_reward

GROUP_TRAINERS = ("grpo", "rloo")


def group_prompt_count(cfg, num_generations: int = 8) -> int:
    """Prompts GRPO/RLOO need for ``cfg.total_episodes`` completions, ``num_generations`` per prompt."""
    return max(1, cfg.total_episodes // cfg.batch_size) * cfg.batch_size // num_generations + 1


# What TRL's GRPOTrainer and RLOOTrainer, run by ``build_group_trainer``, do where our PPOConfig has a choice: a row
# of ours with another value is not TRL's method. Both: no entropy bonus, no missing-eos penalty, advantages not
# whitened, completions decoded without special tokens, their sampling defaults (the runner passes temperature and
# length only).
_TRL_GROUP_FIXED = {
    "ent_coef": 0.0,
    "missing_eos_penalty": None,
    "whiten_advantages": False,
    "skip_special_tokens": True,  # the completions the rewards see
    "top_k": 0,
    "top_p": 1.0,
    "repetition_penalty": 1.0,
}
# GRPO: our minibatches are its steps_per_generation (one shuffle a generated batch in theirs, one an epoch in
# ours), no KL in the reward (beta is the loss's), advantages only group-scaled, the per-token clipped ratio.
TRL_GRPO_FIXED = {
    **_TRL_GROUP_FIXED,
    "advantage_estimator": "grpo",
    "kl_coef": 0.0,
    "kl_loss_estimator": "k3",
    "policy_loss": "clip",
}
# RLOO: its KL is in the reward (its beta is our kl_coef), k1 summed over the sequence, one ratio a sequence,
# averaged over sequences.
TRL_RLOO_FIXED = {
    **_TRL_GROUP_FIXED,
    "advantage_estimator": "rloo",
    "beta": 0.0,
    "kl_estimator": "k1",
    "kl_mode": "sequence",
    "policy_loss": "sequence_clip",
    "loss_type": "grpo",
}
TRL_GROUP_FIXED = {"grpo": TRL_GRPO_FIXED, "rloo": TRL_RLOO_FIXED}

# The options of our config that build_group_trainer and the runner read (tests/test_trl_reads.py records them):
# any other a user sets would change nothing in TRL's run.
_READ_BY_BOTH = (
    "output_dir",
    "total_episodes",
    "batch_size",
    "num_generations",
    "num_ppo_epochs",
    "num_mini_batches",
    "learning_rate",
    "lr_scheduler_type",
    "max_grad_norm",
    "cliprange",
    "temperature",
    "response_length",
    "optim",
    "seed",
    "report_to",
    "gradient_checkpointing",
)
TRL_GROUP_READS = {
    "grpo": frozenset((*_READ_BY_BOTH, "beta", "use_bias_correction_kl", "scale_rewards", "loss_type")),
    "rloo": frozenset((*_READ_BY_BOTH, "kl_coef")),
}


def group_trainer_arguments(kind: str, cfg) -> dict:
    """The options of TRL's ``GRPOConfig``/``RLOOConfig`` that carry our ``cfg``: the ones the update-equality test
    (tests/test_trl_group_equality.py) configures TRL with. Our epochs over a batch are their iterations over a
    generation, each ``num_mini_batches`` optimizer steps (their ``steps_per_generation``); GRPO's ``beta`` (a KL
    in the loss, and its ``use_bias_correction_kl``), ``scale_rewards`` and ``loss_type`` are ours; RLOO's ``beta``
    is a KL in the reward, our ``kl_coef``, and its advantages are not whitened."""
    common = dict(
        num_iterations=cfg.num_ppo_epochs,
        steps_per_generation=cfg.num_mini_batches,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler_type,
        max_grad_norm=cfg.max_grad_norm,
        epsilon=cfg.cliprange,
        temperature=cfg.temperature,
        max_completion_length=cfg.response_length,
        **optimizer_training_argument(cfg.optim),
    )
    if kind == "grpo":
        return dict(
            common,
            beta=cfg.beta,
            use_bias_correction_kl=cfg.use_bias_correction_kl,
            scale_rewards=cfg.scale_rewards,
            loss_type=cfg.loss_type,
        )
    return dict(common, beta=cfg.kl_coef, normalize_advantages=False)


def build_group_trainer(
    kind: str, cfg, policy, tokenizer, reward_fn, prompts, output_dir: str | Path, num_generations: int = 8
):
    """A ready GRPO or RLOO trainer for ``cfg.total_episodes`` completions on ``prompts`` (a TRL prompt
    dataset of at least ``group_prompt_count(cfg)`` rows), configured as our trainer with ``cfg``
    (``group_trainer_arguments``). A decaying rate steps per optimizer step in theirs, per batch in ours.
    """
    from transformers import PrinterCallback, ProgressCallback

    if kind not in GROUP_TRAINERS:
        raise InputError(f"kind must be one of {GROUP_TRAINERS}, got {kind!r}")
    if cfg.batch_size % num_generations:
        raise InputError(f"batch_size {cfg.batch_size} is not divisible by num_generations {num_generations}")
    if kind == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    else:
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer
    # one generated batch of cfg.batch_size a update: num_ppo_epochs x num_mini_batches optimizer steps, as ours
    steps = max(1, cfg.total_episodes // cfg.batch_size) * cfg.num_ppo_epochs * cfg.num_mini_batches
    args = Config(
        output_dir=str(output_dir),
        per_device_train_batch_size=cfg.batch_size // cfg.num_mini_batches,
        num_generations=num_generations,
        max_steps=steps,
        **group_trainer_arguments(kind, cfg),
        seed=cfg.seed,
        **launch_training_arguments(),
        report_to=cfg.report_to,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        **checkpointing_training_argument(cfg.gradient_checkpointing),
        disable_dropout=True,  # disable_dropout: as both PPO backends do
    )
    trainer = Trainer(
        model=policy, reward_funcs=[reward_fn], args=args, train_dataset=prompts, processing_class=tokenizer
    )
    place_reward(reward_fn, trainer.accelerator.device)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer
