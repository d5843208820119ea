"""What ``trl-ext rlhf`` takes, a part per concern (each part's fields are flags of the command), and the recipe's
defaults."""

from __future__ import annotations

from dataclasses import dataclass

from trl_ext.agents.options import AgentOptions
from trl_ext.data.prompt_files import CHAT_TEMPLATE_MODES
from trl_ext.data.reasoning_gym import ANSWER_FORMATS, SPEC_PREFIX
from trl_ext.errors import InputError
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.option_scopes import single_turn_inert
from trl_ext.runs.run import ModelOptions, OutputOptions
from trl_ext.settings.fields import field, require_positive
from trl_ext.settings.layers import CommandOptions, preset_layer


@dataclass
class RLHFModels(ModelOptions):
    """The policy and what scores it."""

    policy: str = field(
        help="causal LM directory (e.g. a Qwen2.5-0.5B-Instruct checkout), or 'catalogue:NAME' for a model of "
        "trl-ext's catalogue (e.g. catalogue:Qwen2.5-Coder-0.5B-Instruct), fetched and converted once into "
        "$TRL_EXT_CACHE/NAME (default ~/.cache/trl-ext/NAME)"
    )
    reward: str | None = field(None, help="scalar reward model directory (e.g. a DeBERTa-v3 reward model)")
    reward_max_length: int = field(512, help="reward model input length")
    pair: bool = field(
        True,
        help="score (prompt, response) as a text pair, as DeBERTa reward models expect "
        "(a reward model trained by --preferences is scored as it was trained: one text)",
    )


@dataclass
class RLHFStages:
    """Optional stages before PPO; each writes a folder of --out and is reused while its inputs and options are
    unchanged."""

    sft_data: str | None = field(
        None,
        help="prompt/completion .jsonl: supervised fine-tuning first (TRL's "
        "SFTTrainer, the LoRA adapter merged); PPO starts from it and keeps it as reference",
    )
    warm_start_games: int = field(
        0,
        help="a public environment's warm start: SFT first on N train games played by a random player (legal "
        "moves at random, in the game's format; warm_start/games.jsonl), so the policy speaks the game's format "
        "but has not been shown its strategy (GuessTheNumber games; 0: none; docs/environments.md)",
    )
    sft_steps: int = field(100, help="SFT optimizer steps")
    sft_learning_rate: float = field(2e-4, help="SFT peak learning rate (cosine decay)")
    preferences: str | None = field(
        None,
        help="preference .jsonl (chosen/rejected, optional prompt/margin): train "
        "the reward model first (TRL's RewardTrainer) instead of giving --reward",
    )
    reward_base: str | None = field(
        None,
        help="base of that reward model (any AutoModelForSequenceClassification, "
        "e.g. DeBERTa-v3); default: the policy after SFT, as InstructGPT does",
    )
    reward_steps: int = field(200, help="reward model optimizer steps")
    reward_learning_rate: float = field(5e-5, help="reward model peak learning rate (cosine decay)")
    reward_eval_n: int = field(100, help="preference rows held out (the file's last ones) for pairwise accuracy")
    stage_batch_size: int = field(8, help="examples a step in the SFT and reward model stages")

    def __post_init__(self):
        if self.warm_start_games < 0:
            raise InputError(f"--warm-start-games must be 0 or more (0: none), got {self.warm_start_games}")
        if self.warm_start_games and self.sft_data:
            raise InputError("give --sft-data or --warm-start-games, not both: the warm start writes the SFT data")
        require_positive(
            self,
            "sft_steps",
            "sft_learning_rate",
            "reward_steps",
            "reward_learning_rate",
            "reward_eval_n",
            "stage_batch_size",
        )


@dataclass
class PromptOptions:
    prompts: str | None = field(
        None,
        help="prompts: .jsonl in TRL's formats ('prompt': text, or a list of "
        "role/content messages), or a text file, a prompt a line (or give --task)",
    )
    task: str | None = field(
        None,
        help="a public task instead of --prompts: a reasoning-gym task or weighted mix, "
        "e.g. 'reasoning-gym:chain_sum' or 'reasoning-gym:chain_sum:2,basic_arithmetic:1'; its "
        "questions, after reasoning-gym's system prompt, are the prompts and its verifier a "
        "reward, summed with --reward/--reward-fn/--reward-url when given (the reasoning-gym "
        "extra; docs/public-tasks.md)",
    )
    task_size: int = field(
        1000, help="prompts --task generates: its train stream of --seed, cycled if the run takes more"
    )
    task_configs: str | None = field(
        None,
        help="--task's generator settings as JSON, per task, e.g. "
        '\'{"chain_sum": {"max_terms": 2, "max_digits": 1}}\' (each task\'s own Config fields)',
    )
    answer_format: str = field(
        "tags",
        help="how --task's answers are read: 'tags' (reasoning-gym's <answer> tags and prompt) or "
        "'last-number' (the reply's last number, its own prompt; numeric tasks only)",
        choices=ANSWER_FORMATS,
    )
    task_eval_size: int = field(
        0,
        help="score the policy greedily on the first N prompts of --task's test stream of --seed, "
        "before and after training (task_eval.json; 0: not at all)",
    )
    max_prompt_length: int = field(256, help="prompts are truncated (on the left) to this many tokens")
    chat_template: str = field(
        "auto",
        help="text prompts as user turns in the policy's chat template: 'auto' "
        "(if it has one), 'always', 'never' (conversations always use it)",
        choices=CHAT_TEMPLATE_MODES,
    )

    def __post_init__(self):
        require_positive(self, "max_prompt_length", "task_size")
        if self.prompts is not None and self.task is not None:
            raise InputError("give --prompts or --task, not both: --task makes the prompts")
        if self.task_eval_size < 0:
            raise InputError(f"--task-eval-size must be 0 or more (0: no evaluation), got {self.task_eval_size}")
        if self.task_eval_size and self.task is None:
            raise InputError("--task-eval-size scores --task's test stream: give --task too")
        if self.task is None and (self.task_configs is not None or self.answer_format != "tags"):
            raise InputError("--task-configs and --answer-format set --task's questions: give --task too")
        if self.task is not None and not self.task.startswith(SPEC_PREFIX):
            raise InputError(f"--task {self.task!r}: expected '{SPEC_PREFIX}TASK' or '{SPEC_PREFIX}TASK:WEIGHT,...'")
        if self.chat_template not in CHAT_TEMPLATE_MODES:
            raise InputError(
                f"chat_template must be one of {', '.join(CHAT_TEMPLATE_MODES)}; got {self.chat_template!r}"
            )


@dataclass
class LoRAOptions:
    lora_r: int = field(16, help="LoRA rank")
    lora_alpha: int = field(32, help="LoRA alpha")
    lora_dropout: float = field(0.05, help="LoRA dropout")
    lora_target_modules: str = field("all-linear", help="LoRA targets: 'all-linear' or comma-separated names")

    def __post_init__(self):
        require_positive(self, "lora_r", "lora_alpha")
        if not 0 <= self.lora_dropout < 1:
            raise InputError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")


RLHF_BACKENDS = ("scratch", "trl")


# the scratch trainer also moves the KL weight toward a KL target, whatever the reward's scale (TRL's PPO
# keeps a fixed weight: the trl backend runs without it). 6 nats an answer: the target TRL's PPO used to default to.
RLHF_SCRATCH_PRESET = {"kl_target": 6.0, "kl_horizon": 32}


@dataclass
class RLHFBackend:
    backend: str = field(
        "scratch",
        help="'scratch' (trl-ext's PPOTrainer, any TRL; it starts from the preset rlhf-scratch: "
        + ", ".join(f"{k} {v:g}" for k, v in RLHF_SCRATCH_PRESET.items())
        + ") or 'trl' (TRL's PPOTrainer, TRL <= 1.12; a fixed KL weight)",
        choices=RLHF_BACKENDS,
    )

    def __post_init__(self):
        if self.backend not in RLHF_BACKENDS:
            raise InputError(f"backend must be one of {', '.join(RLHF_BACKENDS)}; got {self.backend!r}")


# The recipe's defaults for a LoRA policy, measured on a real chat model (docs/real-model.md, "The recipe's
# defaults"): LoRA trains at a far higher rate than full fine-tuning; two epochs an update; a value head that
# starts at zero, so the first advantages come from the rewards alone rather than from a random head's noise; a
# constant rate, since a first run is short and a linear decay spends half of it at under half the rate.
RLHF_DEFAULTS = {
    "learning_rate": 1e-4,
    "lr_scheduler_type": "constant",
    "response_length": 64,
    "num_ppo_epochs": 2,
    "value_head_init": "zero",
}


def rlhf_preset(values: dict):
    """The preset the options pick: rlhf-scratch on the scratch backend."""
    return preset_layer("rlhf-scratch", RLHF_SCRATCH_PRESET) if values["backend"] == "scratch" else None


@dataclass
class RLHFOptions(CommandOptions):
    """Everything ``rlhf`` takes, a part per concern (each part's fields are flags of the command)."""

    train: PPOConfig
    models: RLHFModels
    data: PromptOptions
    lora: LoRAOptions
    stages: RLHFStages
    agents: AgentOptions
    output: OutputOptions
    run: RLHFBackend

    def __post_init__(self):
        data, public = self.data, self.agents.public_environment
        if public and (data.prompts is not None or data.task is not None):
            raise InputError(
                f"--environment {self.agents.environment} makes its games' prompts: give it without --prompts or --task"
            )
        if self.stages.warm_start_games and not public:
            raise InputError("--warm-start-games plays a public environment's games: give --environment gem:NAME")
        if not public and data.prompts is None and data.task is None:
            raise InputError(
                "give --prompts (a prompt file) or --task (a public task, e.g. reasoning-gym:chain_sum), or "
                "--environment gem:NAME / textarena:NAME (a public game)"
            )

    def inert_options(self, names) -> dict[str, str]:
        """Of ``names``, the options that would change nothing: for this backend's runner (``runners.inert_options``),
        and the multi-turn ones without tools or an environment."""
        from trl_ext.runs.runners import inert_options

        # rlhf's backends are runners' names; it loads every backend's models in dtype
        inert = inert_options(self.run.backend, self.train, [n for n in names if n != "dtype"])
        return {**inert, **({} if self.agents.multi_turn else single_turn_inert(names))}
