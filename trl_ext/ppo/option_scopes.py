"""Options that act only with another setting, and the runs where they act on nothing.

``inert_options`` says, of some options, which cannot change the scratch trainer's run and what each acts with. The
command line refuses such an option where the user gave it another value than the run had anyway (a flag, the YAML
file; ``PPOConfig.inert_options``, the commands' options classes for their backends); what a command's defaults or
a preset set is not the user's doing. The trainer, once it knows its engine, refuses an engine option set away from
its default for an engine that never reads it, or warns where 'auto' chose that engine by machine.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import fields

from trl_ext.errors import InputError
from trl_ext.ppo.advantages import needs_values
from trl_ext.ppo.rollout.samplers import SAMPLERS

# Options only the vLLM engine reads: an engine registered without takes_config is never handed them.
ENGINE_OPTIONS = (
    "vllm_gpu_memory_utilization",
    "vllm_enable_sleep_mode",
    "vllm_tensor_parallel_size",
    "vllm_max_model_length",
)
SERVER_OPTIONS = (
    "vllm_server_base_url",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout",
    "vllm_server_weights_dir",
)
CORRECTION_OPTIONS = (
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min",
)
MULTI_TURN_OPTIONS = ("max_tool_calling_iterations",)
CRITIC_OPTIONS = (
    "vf_coef",
    "cliprange_value",
    "separate_critic",
    "value_head_init",
    "critic_learning_rate",
    "num_critic_epochs",
)
# An estimator's option: the built-in estimators that never read it (a user's estimator is handed the config and
# may read any), and those that do.
ESTIMATOR_OPTIONS = {
    "scale_rewards": (("gae", "turn_gae", "rloo", "reinforce_pp"), "advantage_estimator 'grpo'"),
    "lam": (("grpo", "rloo", "reinforce_pp"), "advantage_estimator 'gae'"),
    "gamma": (("grpo", "rloo"), "advantage_estimator 'gae' or 'reinforce_pp'"),
}


def _scopes(config, engine: str | None) -> Iterator[tuple[tuple[str, ...], bool, str]]:
    """(options, whether what they act with holds in the scratch trainer's run, what that is); ``engine`` None: not
    known yet ('auto' picks it when the trainer starts)."""
    estimator = config.advantage_estimator
    colocated = (engine is None or SAMPLERS[engine].takes_config) and config.vllm_mode != "server"
    engine_now = f"sampler {engine or config.sampler!r}, vllm_mode {config.vllm_mode!r}"
    yield ENGINE_OPTIONS, colocated, f"the vllm sampler colocated (this run's: {engine_now})"
    yield SERVER_OPTIONS, config.vllm_mode == "server", "vllm_mode 'server'"
    yield CORRECTION_OPTIONS, config.vllm_importance_sampling_correction, "vllm_importance_sampling_correction"
    yield CRITIC_OPTIONS, needs_values(config), f"an estimator that has a critic, as gae (this run's: {estimator!r})"
    for name, (built_ins, readers) in ESTIMATOR_OPTIONS.items():
        yield (name,), estimator not in built_ins, f"{readers} (this run's: {estimator!r})"
    yield ("kl_horizon",), config.kl_target is not None, "kl_target set"
    yield ("kl_loss_estimator", "use_bias_correction_kl"), config.beta > 0, "beta > 0"
    yield ("positive_lm_threshold",), config.positive_lm_coef > 0, "positive_lm_coef > 0"
    # a lost vLLM server saves the run whatever save_steps says, and that save keeps the newest save_total_limit
    yield ("save_total_limit",), config.save_steps > 0 or config.vllm_mode == "server", "save_steps > 0"
    yield ("critic_warmup_min_delta",), config.critic_warmup_patience > 0, "critic_warmup_patience > 0"


def inert_options(config, names: Iterable[str], engine: str | None = None) -> dict[str, str]:
    """Of ``names``, those that cannot change the scratch trainer's run, each with what it acts with."""
    names = set(names)
    return {
        name: needs
        for options, holds, needs in _scopes(config, engine)
        if not holds
        for name in options
        if name in names
    }


def single_turn_inert(names: Iterable[str]) -> dict[str, str]:
    """Of ``names``, the multi-turn rollouts' options, for a run with no tools or environment."""
    return {name: "tools or an environment (multi-turn rollouts)" for name in names if name in MULTI_TURN_OPTIONS}


def check_engine_options(config, sampler, engine: str) -> None:
    """The engine's options against the engine the trainer runs: one it never reads, set away from its default, is
    refused where the engine was named and a warning where 'auto' picked it; so is the importance-sampling
    correction where the engine returns no log-probs."""
    defaults = {f.name: f.default for f in fields(config)}
    inert = inert_options(config, [n for n in ENGINE_OPTIONS if getattr(config, n) != defaults[n]], engine)
    problems = []
    if inert:
        verb = "act" if len(inert) > 1 else "acts"
        problems.append(f"{', '.join(inert)} {verb} only with {next(iter(inert.values()))}")
    if config.vllm_importance_sampling_correction and not sampler.returns_logprobs:
        problems.append(
            f"vllm_importance_sampling_correction needs a rollout engine that returns its log-probs; "
            f"sampler {engine!r} returns none"
        )
    if not problems:
        return
    if config.sampler != "auto":
        raise InputError("; ".join(problems))
    message = f"{'; '.join(problems)} ('auto' chose that engine on this machine): the run goes on as if unset"
    warnings.warn(message, stacklevel=3)
