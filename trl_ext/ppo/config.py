"""Options of the scratch trainer; names follow TRL's ``PPOConfig`` where the meaning is the same."""

from __future__ import annotations

from dataclasses import dataclass

from trl_ext.models.dtypes import DTYPES
from trl_ext.ppo import core
from trl_ext.ppo.advantages import ADVANTAGE_ESTIMATORS
from trl_ext.ppo.config_checks import check_config
from trl_ext.ppo.losses import LOSS_AGGREGATIONS, POLICY_LOSSES
from trl_ext.ppo.model import VALUE_HEAD_INITS
from trl_ext.ppo.optimizers import DEFAULT_OPTIMIZER, OPTIMIZERS
from trl_ext.ppo.option_scopes import inert_options
from trl_ext.rollouts import ROLLOUTS
from trl_ext.settings.fields import field

LR_SCHEDULES = ("linear", "constant")
VLLM_MODES = ("colocate", "server")
IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
SCORE_POSITIONS = ("last_token", "after_last_token")
SCALE_REWARDS = ("group", "batch", "none")


@dataclass
class PPOConfig:
    """The scratch trainer's options, grouped by concern: the run and its optimizer, sampling, rewards, KL,
    advantages, the policy loss, the critic, memory and precision, checkpoints."""

    # The run and the optimizer: how many rollouts, in what batches, at what learning rate
    output_dir: str | None = field(
        None, help="where a bad loss saves the last good policy (the CLI sets it from --out)", cli=False
    )
    total_episodes: int = field(1024, help="rollouts in the whole run, over all processes (128 updates of 8)")
    batch_size: int = field(8, help="rollouts per update on each process (TRL: per_device_train_batch_size)")
    num_mini_batches: int = field(
        1, help="minibatches per PPO epoch; batch_size: one rollout a step, as the doubling-task tutorial updates"
    )
    num_ppo_epochs: int = field(4, help="passes over each batch of rollouts")
    learning_rate: float = field(
        3e-6,
        help="AdamW learning rate (the defaults are a real LLM run's, TRL's own where TRL "
        "has the option; the doubling task's: trl_ext.tasks.doubling.ppo_settings)",
    )
    lr_scheduler_type: str = field(
        "linear", help="'linear': decay to 0 over the run (TRL's default); 'constant'", choices=LR_SCHEDULES
    )
    optim: str = field(
        DEFAULT_OPTIMIZER,
        help="transformers' name of the optimizer: 'adamw_torch_fused': torch's AdamW (fused on a GPU); "
        "'adamw_torch_8bit': torchao's AdamW8bit, moments in 8 bits (pip install torchao)",
        choices=tuple(OPTIMIZERS),
    )
    max_grad_norm: float = field(0.0, help="gradient clipping norm; 0 turns clipping off (TRL's PPO never clips)")
    seed: int = field(0, help="seed for prompt order, sampling and initialisation")

    # Sampling: the rollouts and the engine that makes them
    response_length: int = field(53, help="most tokens a response may have")
    temperature: float = field(0.7, help="sampling temperature of rollouts")
    top_k: int = field(0, help="sample among the k likeliest tokens (0: all)")
    top_p: float = field(1.0, help="sample from the smallest set of tokens holding this probability (1.0: all)")
    repetition_penalty: float = field(1.0, help="HF generate's repetition penalty (sampler 'generate' only)")
    num_generations: int = field(
        1,
        help="completions sampled per prompt in one rollout (GRPO/RLOO's groups); "
        "batch_size counts completions and must be divisible by it",
    )
    sampler: str = field(
        "auto",
        help="rollout engine, by its name in trl_ext.ppo.rollout.samplers.SAMPLERS or "
        "your own as module:name: 'loop': the KV-cache loop; 'generate': model.generate "
        "(repetition_penalty); 'static': static KV cache, decode step compiled to a CUDA graph; 'static-copy': "
        "the same over a copy of the policy in the forward's dtype, LoRA merged (one more set of weights); "
        "'vllm': vLLM, colocated in each training process or a server (vllm_mode); 'auto': the one measured "
        "fastest here (static on a GPU; vLLM on CPU for large policies where installed; else loop)",
    )
    vllm_mode: str = field(
        "colocate",
        help="TRL's names: 'colocate': an engine inside each training process; 'server': a vLLM server you start "
        "in development mode (docs/vllm.md), weights synced to it after each update",
        choices=VLLM_MODES,
    )
    vllm_server_base_url: str | None = field(
        None, help="the server's URL (e.g. http://10.0.0.2:8000); overrides host and port"
    )
    vllm_server_host: str = field("0.0.0.0", help="the server's host, when no base URL is given")
    vllm_server_port: int = field(8000, help="the server's port, when no base URL is given")
    vllm_server_timeout: float = field(
        240.0, help="seconds to wait for the server (to answer at the start, to come back after a failed request)"
    )
    vllm_server_weights_dir: str | None = field(
        None,
        help="where the CPU weight sync writes the policy for the server to load (a folder both can read; "
        "default: a temporary folder, for a server on this machine)",
    )
    max_staleness: int = field(
        0,
        help="0: each batch is sampled from the weights being trained (on-policy); 1: the next batch is sampled "
        "on a background thread while the trainer updates on this one (one step off-policy; vLLM engines only)",
    )
    vllm_gpu_memory_utilization: float = field(0.3, help="share of GPU memory vLLM may take for weights and KV cache")
    vllm_enable_sleep_mode: bool = field(
        False, help="release vLLM's weights and KV cache during the update, wake them for the next rollout (GPU)"
    )
    vllm_tensor_parallel_size: int = field(1, help="GPUs one vLLM engine spans")
    vllm_max_model_length: int | None = field(None, help="vLLM's context length (default: the model's)")
    vllm_importance_sampling_correction: bool = field(
        False,
        help="weight the policy loss by the ratio of the "
        "trainer's to the engine's log-probs of the sampled tokens, "
        "capped (TRL's vLLM correction), with any engine that "
        "returns its log-probs (vllm's); for bf16 runs, where they "
        "differ",
    )
    vllm_importance_sampling_mode: str = field(
        "token_truncate",
        help="per token or per sequence; clip the ratio into [min, max] (truncate) or zero it outside (mask)",
        choices=IMPORTANCE_SAMPLING_MODES,
    )
    vllm_importance_sampling_clip_max: float = field(3.0, help="upper bound of the importance-sampling ratio")
    vllm_importance_sampling_clip_min: float | None = field(None, help="lower bound of the ratio (default: none)")
    rollout: str = field(
        "single_turn",
        help="what makes a batch's rollouts, by its name in "
        "trl_ext.rollouts.ROLLOUTS or your own Rollout as module:name ('single_turn': one completion "
        "a prompt; tools, environment_factory and rollout_func make their own)",
        choices=ROLLOUTS,
    )
    max_tool_calling_iterations: int | None = field(
        None,
        help="multi-turn rollouts (tools, environment_factory): "
        "rounds of tool calls a rollout may make (TRL's option; None: "
        "no limit but response_length, one token budget for all turns)",
    )

    # Rewards: how completions reach the reward functions and where the score lands
    reward_weights: list[float] | None = field(
        None, help="one weight per reward function (GRPO's option); default: all 1.0", cli=False
    )
    skip_special_tokens: bool = field(
        True,
        help="decode completions for reward functions without special tokens, "
        "as TRL's GRPO does; False keeps the eos the reward model may expect",
    )
    missing_eos_penalty: float | None = field(
        None, help="subtract this from the score of a response that ends without eos (TRL's option; default: none)"
    )
    score_position: str = field(
        "last_token",
        help="where the score lands: on the last response token (the "
        "doubling-task tutorial), "
        "or one token after it where the batch has room, its value trained too (TRL 1.12)",
        choices=SCORE_POSITIONS,
    )

    # KL to the reference: in the reward (kl_coef) and as a loss term (beta)
    kl_coef: float = field(0.05, help="weight of the KL penalty to the reference policy (with kl_target: its start)")
    kl_target: float | None = field(
        None,
        help="adapt kl_coef after each update toward this KL per rollout (summed "
        "over its tokens), Ziegler et al. 2019's controller (TRL <0.12: target); None: "
        "kl_coef stays fixed",
    )
    kl_horizon: int = field(
        10000,
        help="the adaptive controller's time scale in episodes: an update of "
        "B episodes moves kl_coef by at most 0.2*B/kl_horizon of itself (TRL <0.12: horizon)",
    )
    kl_estimator: str = field("k1", help="per-token KL estimate", choices=core.KL_ESTIMATORS)
    kl_mode: str = field(
        "token",
        help="'token': -kl_coef*kl per token (TRL's PPO, the doubling-task tutorial); "
        "'sequence': score - kl_coef*sum(kl) on the last token (TRL's RLOO, the hand-written "
        "RLHF notebook); or your own as module:name",
        choices=core.KL_SHAPINGS,
    )
    beta: float = field(
        0.0, help="weight of the KL to the reference as a loss term (GRPO's beta), besides kl_coef's KL in the reward"
    )
    kl_loss_estimator: str = field(
        "k3", help="per-token KL estimate of the beta loss term (GRPO: k3)", choices=core.KL_ESTIMATORS
    )
    use_bias_correction_kl: bool = field(
        True,
        help="weight the beta KL term by the policy ratio, so that its "
        "gradient is the unbiased reverse-KL one (TRL's GRPO option and default)",
    )

    # Advantages: the estimator and its normalisation
    advantage_estimator: str = field(
        "gae",
        help="'gae': PPO with a critic; 'turn_gae': PPO with a turn-level critic (GAE over a multi-turn "
        "rollout's turns, one advantage a turn); critic-free: 'grpo' (group-normalised), "
        "'rloo' (leave-one-out), 'reinforce_pp' (REINFORCE++); "
        "trl_ext.ppo.advantages.ADVANTAGE_ESTIMATORS, or your own as module:name",
        choices=ADVANTAGE_ESTIMATORS,
    )
    scale_rewards: str = field(
        "group",
        help="grpo: divide by the group's std, the batch's, or not at all (TRL's scale_rewards)",
        choices=SCALE_REWARDS,
    )
    whiten_advantages: bool | None = field(
        None,
        help="whiten advantages over the batch (default: the "
        "estimator's choice: gae and reinforce_pp yes, grpo and rloo no)",
    )
    whiten_rewards: bool = field(False, help="whiten the shaped rewards before GAE")
    gamma: float = field(1.0, help="discount")
    lam: float = field(
        0.95, help="GAE lambda (gae: of the policy's advantages, and of the critic's returns unless critic_lam is set)"
    )
    critic_lam: float | None = field(
        None,
        help="gae: lambda of the critic's returns alone, the policy's advantages "
        "keeping lam (VAPO's decoupled GAE: 1.0); None: lam",
    )
    lam_length_alpha: float | None = field(
        None,
        help="gae: the policy's lambda per row, 1 - 1/(alpha * its model "
        "tokens), floored at 0 (VAPO's length-adaptive GAE: 0.05); None: lam",
    )

    # The policy loss
    policy_loss: str = field(
        "clip",
        help="'clip': PPO's clipped surrogate per token; 'sequence_clip': one "
        "ratio per sequence (TRL's RLOO); or your own as module:name",
        choices=POLICY_LOSSES,
    )
    policy_loss_kwargs: dict | None = field(
        None,
        help="the policy loss's own settings, checked against its "
        'signature (JSON on the command line, e.g. \'{"cliprange_high": '
        "0.28}')",
    )
    loss_type: str = field(
        "bnpo",
        help="how token losses are averaged (TRL's names): 'bnpo' over all tokens "
        "(PPO), 'grpo' per sequence then over sequences, 'dr_grpo' sum over rows x "
        "response_length",
        choices=LOSS_AGGREGATIONS,
    )
    cliprange: float = field(0.2, help="policy ratio clip")
    cliprange_high: float | None = field(
        None,
        help="policy_loss 'clip': the ratio's upper clip, 1 + cliprange_high "
        "(DAPO's clip-higher: 0.28); None: cliprange",
    )
    ent_coef: float = field(0.0, help="entropy bonus weight")
    positive_lm_coef: float = field(
        0.0,
        help="weight of a language-model loss, the mean negative log-likelihood of "
        "the tokens of rows scored above positive_lm_threshold (VAPO: 0.1); 0: none",
    )
    positive_lm_threshold: float = field(0.0, help="a row's score must exceed this for the positive-sample LM loss")

    # The critic (advantage_estimator 'gae')
    vf_coef: float = field(0.1, help="value loss weight")
    critic_learning_rate: float | None = field(
        None,
        help="the critic's own learning rate (value head, and the critic's backbone or adapter where it has one), "
        "a parameter group of its own (OpenRLHF's and verl's critic optimizer); None: learning_rate",
    )
    num_critic_epochs: int | None = field(
        None,
        help="passes of the value loss over each batch, at least num_ppo_epochs: the passes beyond those train "
        "the critic alone (verl's critic ppo_epochs); None: num_ppo_epochs",
    )
    cliprange_value: float | None = field(
        0.2, help="value clip around the old values (TRL's, OpenRLHF's value_clip); None: the value loss unclipped"
    )
    separate_critic: bool = field(False, help="value head on a copy of the backbone instead of the shared one")
    critic_adapter: bool = field(
        False,
        help="with LoRA (peft_config): the value head on a second LoRA adapter of "
        "its own on the policy's frozen base, a separate critic for the price of an adapter "
        "(the reference: the base, adapters off)",
    )
    value_head_init: str = field(
        "linear",
        help="'linear': nn.Linear's random init, as TRL's value head; 'zero': "
        "start at V = 0 (docs/decisions.md, 'The KL gap')",
        choices=VALUE_HEAD_INITS,
    )
    critic_init: str | None = field(
        None,
        help="a scalar reward model of the policy's architecture (num_labels=1, "
        "e.g. from train-reward-model) whose backbone and score head start the separate "
        "critic (the RLHF-derivation tutorial)",
    )
    critic_warmup_steps: int = field(
        0,
        help="first updates that train the value function alone, the policy "
        "unchanged (OpenRLHF's and verl's critic warm-up; estimators with a critic); "
        "with critic_warmup_patience, the most of them",
    )
    critic_warmup_patience: int = field(
        0,
        help="end the warm-up once this many updates in a row bring no value loss "
        "below (1 - critic_warmup_min_delta) x the lowest before them (VC-PPO's "
        "value pretraining); 0: all critic_warmup_steps",
    )
    critic_warmup_min_delta: float = field(0.0, help="the relative fall of the value loss that counts as falling")
    critic_warmup_lam: float | None = field(
        None,
        help="lambda of the critic's returns during the warm-up (VC-PPO: 1.0, Monte-Carlo returns); None: as after it",
    )

    # Memory and precision
    dtype: str = field(
        "auto",
        help="dtype the policy (and a reward model given by path) is loaded in: 'auto' keeps "
        "the checkpoint's; trainable weights are float32 masters either way (docs/training-at-scale.md)",
        choices=DTYPES,
    )
    local_rollout_forward_batch_size: int = field(
        0,
        help="rows per forward pass of the experience phase (policy, "
        "reference, critic); 0: as many as keep one pass's logits under "
        "2**27 values on CPU, one per 64 bytes of a GPU's memory (TRL's name)",
    )
    micro_batch_size: int = field(
        0,
        help="rows per forward/backward in the update, gradients accumulated over a "
        "minibatch (same result, less memory); 0: sized like the experience passes",
    )
    gradient_checkpointing: bool = field(False, help="recompute activations in the backward pass (less memory)")
    chunked_lm_head: bool = field(
        False,
        help="log-probs from the last hidden states, the LM head applied to chunks of positions and recomputed "
        "in the backward pass: no (rows, tokens, vocabulary) logits in memory (gpt2, llama, mistral, qwen2, "
        "qwen3 models; one process or DDP)",
    )
    padding_free: bool = field(
        False,
        help="experience and update passes on packed rows: each row's real tokens end to end, attention kept within a "
        "sequence by a 4D block-diagonal mask (sdpa or eager attention), passes filled by tokens, not rows "
        "(docs/training-at-scale.md)",
    )

    # Checkpoints and trackers
    save_steps: int = field(0, help="write a checkpoint every N updates and at the end (0: never)")
    save_total_limit: int = field(0, help="keep only the newest N checkpoints (0: keep all)")
    resume_from_checkpoint: str | None = field(
        None, help="a checkpoint directory, or 'latest' for the newest complete one in the output directory"
    )
    report_to: str = field(
        "none",
        help="trackers, as TRL spells them: 'none', 'all', or comma-separated "
        "names (tensorboard, wandb, trackio, mlflow, ...)",
    )

    def __post_init__(self):
        check_config(self)

    def inert_options(self, names) -> dict[str, str]:
        """Of ``names``, the options that cannot change this run, each with what it acts with (the command line
        refuses those the user gave)."""
        return inert_options(self, names, None if self.sampler == "auto" else self.sampler)


def mini_batch_size(config: PPOConfig) -> int:
    return config.batch_size // config.num_mini_batches


def num_updates(config: PPOConfig, world_size: int) -> int:
    """Updates in the run: ``total_episodes`` over the rollouts all processes make per update (rounded up)."""
    per_update = config.batch_size * world_size
    return max(1, -(-config.total_episodes // per_update))
