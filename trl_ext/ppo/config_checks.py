"""The checks a ``PPOConfig`` passes when it is made: each bad setting is one ``InputError`` naming it."""

from __future__ import annotations

from dataclasses import fields

from trl_ext.errors import InputError
from trl_ext.ppo.advantages import ADVANTAGE_ESTIMATORS
from trl_ext.ppo.losses import check_policy_loss_settings, loss_settings, takes_setting
from trl_ext.ppo.optimizers import check_optimizer
from trl_ext.ppo.rollout import samplers
from trl_ext.settings.fields import check_field_types, require_positive
from trl_ext.settings.registry import Registry


def check_config(config) -> None:
    """Refuse a bad setting of a ``PPOConfig`` with one line; ``reward_weights`` comes back as floats."""
    check_field_types(config)
    require_positive(
        config,
        "learning_rate",
        "batch_size",
        "num_mini_batches",
        "num_ppo_epochs",
        "total_episodes",
        "response_length",
        "temperature",
        "num_generations",
        "kl_horizon",
    )
    for name in (
        "local_rollout_forward_batch_size",
        "micro_batch_size",
        "critic_warmup_steps",
        "save_steps",
        "save_total_limit",
        "max_grad_norm",
        "kl_coef",
        "cliprange",
        "cliprange_value",
        "vf_coef",
        "ent_coef",
        "beta",
        "cliprange_high",
        "positive_lm_coef",
        "critic_warmup_patience",
        "critic_warmup_min_delta",
    ):
        if getattr(config, name) is not None and getattr(config, name) < 0:
            raise InputError(f"{name} must not be negative, got {getattr(config, name)}")
    for name in ("gamma", "lam", "critic_lam", "critic_warmup_lam"):
        if getattr(config, name) is not None and not 0 <= getattr(config, name) <= 1:
            raise InputError(f"{name} must be within [0, 1], got {getattr(config, name)}")
    if config.lam_length_alpha is not None and config.lam_length_alpha <= 0:
        raise InputError(f"lam_length_alpha must be positive, got {config.lam_length_alpha}")
    if config.critic_warmup_min_delta >= 1:
        raise InputError(
            f"critic_warmup_min_delta is a fraction of the loss below 1, got {config.critic_warmup_min_delta}"
        )
    if config.kl_target is not None and (config.kl_target <= 0 or config.kl_coef <= 0):
        raise InputError(
            f"kl_target needs a positive target and a positive starting kl_coef to adapt; got "
            f"kl_target={config.kl_target}, kl_coef={config.kl_coef}"
            + (
                ""
                if config.kl_coef > 0
                else " (no KL in the reward to adapt, as GRPO's presets set it: give kl_coef a start; only the "
                "scratch trainer adapts it, TRL's trainers keep theirs fixed)"
            )
        )
    if config.max_tool_calling_iterations is not None and config.max_tool_calling_iterations < 0:
        raise InputError(f"max_tool_calling_iterations must not be negative, got {config.max_tool_calling_iterations}")
    if config.missing_eos_penalty is not None and config.missing_eos_penalty < 0:
        raise InputError(f"missing_eos_penalty must not be negative, got {config.missing_eos_penalty}")
    if config.batch_size % config.num_mini_batches:
        raise InputError(
            f"batch_size {config.batch_size} is not divisible by num_mini_batches {config.num_mini_batches}"
        )
    if config.batch_size % config.num_generations:
        raise InputError(f"batch_size {config.batch_size} is not divisible by num_generations {config.num_generations}")
    if not 0 < config.top_p <= 1 or config.top_k < 0 or config.repetition_penalty <= 0:
        raise InputError(
            f"need 0 < top_p <= 1, top_k >= 0, repetition_penalty > 0; got top_p={config.top_p}, "
            f"top_k={config.top_k}, repetition_penalty={config.repetition_penalty}"
        )
    check_optimizer(config.optim)
    if config.max_staleness not in (0, 1):
        raise InputError(
            f"max_staleness must be 0 (on-policy) or 1 (one step off-policy); got {config.max_staleness!r}"
        )
    if config.vllm_mode == "server" and config.sampler not in ("vllm", "auto"):
        raise InputError(f"vllm_mode 'server' is the vllm sampler's; sampler is {config.sampler!r}: set sampler='vllm'")
    if config.vllm_server_timeout <= 0 or not 0 < config.vllm_server_port < 65536:
        raise InputError(
            f"need vllm_server_timeout > 0 and a port in 1-65535; got {config.vllm_server_timeout}, "
            f"{config.vllm_server_port}"
        )
    if config.vllm_tensor_parallel_size < 1 or not 0 < config.vllm_gpu_memory_utilization <= 1:
        raise InputError(
            f"need vllm_tensor_parallel_size >= 1 and 0 < vllm_gpu_memory_utilization <= 1; got "
            f"{config.vllm_tensor_parallel_size}, {config.vllm_gpu_memory_utilization}"
        )
    low, high = config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max
    if not high > 0 or (low is not None and not 0 <= low <= high):
        raise InputError(
            f"the importance-sampling bounds need 0 <= vllm_importance_sampling_clip_min <= "
            f"vllm_importance_sampling_clip_max and a positive maximum; got {low} and {high}"
        )
    if config.repetition_penalty != 1.0 and config.sampler != "generate":
        raise InputError("repetition_penalty needs sampler='generate' (the other samplers have none)")
    trackers(config.report_to)  # an unknown name fails here, listing the known ones
    for f in fields(config):  # every set of choices is written once, in its field
        choices, value = f.metadata.get("choices"), getattr(config, f.name)
        if isinstance(choices, Registry):
            choices[value]  # the live registry: a registered name, or user code that imports and registers
        elif choices and value not in choices:
            raise InputError(f"{f.name} must be one of {', '.join(choices)}; got {value!r}")
    if config.sampler != "auto":
        samplers.SAMPLERS[config.sampler]
    if config.policy_loss_kwargs is not None and not isinstance(config.policy_loss_kwargs, dict):
        raise InputError(f"policy_loss_kwargs must be a mapping, got {config.policy_loss_kwargs!r}")
    if config.cliprange_high is not None and "cliprange_high" in (config.policy_loss_kwargs or {}):
        raise InputError("cliprange_high is given twice, as the option and in policy_loss_kwargs: give it once")
    if config.cliprange_high is not None and not takes_setting(config.policy_loss, "cliprange_high"):
        raise InputError(
            f"cliprange_high is a keyword of the policy loss, and policy_loss {config.policy_loss!r} takes none "
            "(the built-in 'clip' does)"
        )
    check_policy_loss_settings(config.policy_loss, loss_settings(config))
    critic = ADVANTAGE_ESTIMATORS[config.advantage_estimator].needs_values  # a known name by now
    if config.critic_lam is not None and config.advantage_estimator not in ("gae", "turn_gae"):
        raise InputError(
            f"critic_lam is gae's and turn_gae's setting; advantage_estimator is {config.advantage_estimator!r}"
        )
    if config.lam_length_alpha is not None and config.advantage_estimator != "gae":
        raise InputError(
            f"lam_length_alpha is gae's setting (a lambda per row's tokens); advantage_estimator is "
            f"{config.advantage_estimator!r}"
        )
    if (config.critic_warmup_patience or config.critic_warmup_lam is not None) and not config.critic_warmup_steps:
        raise InputError("critic_warmup_patience and critic_warmup_lam need critic_warmup_steps (the warm-up's cap)")
    if (config.critic_warmup_steps or config.critic_init) and not critic:
        raise InputError(
            f"critic_warmup_steps and critic_init need a critic, and advantage_estimator "
            f"{config.advantage_estimator!r} has none (use gae)"
        )
    if config.critic_learning_rate is not None and not config.critic_learning_rate > 0:
        raise InputError(
            f"critic_learning_rate must be positive (None: learning_rate), got {config.critic_learning_rate}"
        )
    if config.num_critic_epochs is not None and config.num_critic_epochs < config.num_ppo_epochs:
        raise InputError(
            f"num_critic_epochs ({config.num_critic_epochs}) must be at least num_ppo_epochs "
            f"({config.num_ppo_epochs}): the critic trains in every PPO epoch, and alone in the ones beyond"
        )
    if config.critic_init and not config.separate_critic:
        raise InputError("critic_init needs separate_critic=True: the reward model's backbone becomes the critic's")
    if config.critic_adapter and (config.separate_critic or not critic):
        raise InputError(
            "critic_adapter gives the critic of advantage_estimator 'gae' a LoRA adapter of its own; "
            "not with separate_critic (a copy of the backbone) or a critic-free estimator"
        )
    if config.reward_weights is not None:
        if (
            not isinstance(config.reward_weights, (list, tuple))
            or not config.reward_weights
            or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in config.reward_weights)
        ):
            raise InputError(f"reward_weights must be a non-empty list of numbers, got {config.reward_weights!r}")
        config.reward_weights = [float(w) for w in config.reward_weights]


def trackers(report_to: str) -> list[str]:
    """``report_to`` as accelerate's tracker names (``[]`` for none); an unknown name is a ValueError."""
    from accelerate.utils import LoggerType

    known = [t.value for t in LoggerType if t.value != "all"]
    names = [n.strip() for n in str(report_to).split(",") if n.strip()]
    if names in ([], ["none"]):
        return []
    if names == ["all"]:
        return ["all"]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(
            f"unknown tracker(s) {', '.join(unknown)} in report_to: known are none, all, {', '.join(known)}"
        )
    from accelerate.tracking import get_available_trackers

    available = {str(t.value) for t in get_available_trackers()}
    missing = [n for n in names if n not in available]  # accelerate would drop them, saying so only at debug level
    if missing:
        raise InputError(
            f"report_to names {', '.join(missing)}, not installed here: pip install {' '.join(missing)}, "
            "or report_to='none'"
        )
    return names


def check_groups(config) -> None:
    """An estimator that compares a prompt's completions needs several of them (TRL's GRPO and RLOO configs refuse
    one): with one, every advantage is 0 and nothing trains. Checked where trl-ext trains, not in the config: TRL's
    group trainers take ``num_generations`` apart."""
    if ADVANTAGE_ESTIMATORS[config.advantage_estimator].needs_groups and config.num_generations < 2:
        raise InputError(
            f"advantage_estimator {config.advantage_estimator!r} compares the completions of one prompt and needs "
            f"num_generations >= 2 (got {config.num_generations}): every advantage would be 0 and nothing would "
            "train; set num_generations (batch_size must be divisible by it)"
        )


def trainer_config(args, config_class):
    """The trainer's ``args`` (``config_class()`` when None), refused when it is another class (TRL's own config
    holds other names) or when its estimator needs groups it does not have."""
    if args is not None and not isinstance(args, config_class):
        kind = f"{type(args).__module__.split('.')[0]}'s {type(args).__name__}"
        raise InputError(
            f"args must be a trl_ext.ppo.PPOConfig, got {kind}: build trl_ext.ppo.PPOConfig(...), which takes "
            "TRL's names where the meaning is the same"
        )
    config = args if args is not None else config_class()
    check_groups(config)
    return config
