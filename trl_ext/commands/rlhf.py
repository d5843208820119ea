"""Real-LLM PPO (seeds 001-004): a causal LM policy with LoRA, a scalar reward model such as a
DeBERTa reward model scored on (prompt, response) pairs, either backend.

The policy and the value head share one LoRA-adapted backbone (seed 001: "one large model,
LoRA layers, different heads"); the reference policy is the base model without the adapter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trl_ext.commands.outputs import OutputOptions, prepare_out_dir, train_options
from trl_ext.commands.parsing import Command, CommandResult, options_dict
from trl_ext.options import field
from trl_ext.ppo.config import PPOConfig


@dataclass
class RLHFModels:
    """The policy and what scores it."""

    policy: str = field(help="causal LM directory (e.g. a Qwen2.5-0.5B-Instruct checkout)")
    reward: str | None = field(None, help="scalar reward model directory (e.g. a DeBERTa-v3 reward model)")
    reward_fn: str | None = field(None, help="your own reward function as 'module:callable' (TRL's reward_funcs "
                                  "convention); summed with --reward when both are given")
    reward_max_length: int = field(512, help="reward model input length")
    pair: bool = field(True, help="score (prompt, response) as a text pair, as DeBERTa reward models expect")

    def __post_init__(self):
        if not self.reward and not self.reward_fn:
            raise ValueError("give --reward (a reward model directory) or --reward-fn (module:callable), or both")


@dataclass
class PromptOptions:
    prompts: str = field(help="prompts: a .jsonl file with a 'prompt' field per line, or a .txt file")
    max_prompt_length: int = field(256, help="prompts are truncated (on the left) to this many tokens")


@dataclass
class LoRAOptions:
    lora_r: int = field(16, help="LoRA rank")
    lora_alpha: int = field(32, help="LoRA alpha")
    lora_dropout: float = field(0.05, help="LoRA dropout")
    lora_target_modules: str = field("all-linear", help="LoRA targets: 'all-linear' or comma-separated names")


RLHF_BACKENDS = ("scratch", "trl")


@dataclass
class RLHFBackend:
    backend: str = field("scratch", help="'scratch' (trl-ext's PPO, any TRL) or 'trl' (TRL's PPOTrainer, TRL <= 1.12)",
                         choices=RLHF_BACKENDS)

    def __post_init__(self):
        if self.backend not in RLHF_BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(RLHF_BACKENDS)}; got {self.backend!r}")


# Real-LLM scale: the trainer's defaults are the doubling task's.
RLHF_DEFAULTS = {"learning_rate": 1e-5, "batch_size": 8, "total_episodes": 1024, "response_length": 64,
                 "kl_coef": 0.05, "vf_coef": 0.1}


def load_prompts(path: str | Path) -> list[str]:
    """Prompts from .jsonl (a 'prompt' per line) or .txt (a prompt per line); errors name the line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompts file {str(path)!r} does not exist")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not valid JSON ({err})") from err
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
                raise ValueError(f"{path}:{number}: expected an object with a non-empty string 'prompt'")
            prompts.append(row["prompt"])
        else:
            prompts.append(line)
    if not prompts:
        raise ValueError(f"prompts file {str(path)!r} holds no prompts")
    return prompts


def load_models(models: RLHFModels):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from trl_ext.rewards import ClassifierReward, WeightedSum
    from trl_ext.rewards.base import import_reward_function

    tokenizer = AutoTokenizer.from_pretrained(models.policy)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the policy tokenizer in {models.policy!r} has no eos token: responses could never end")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # documented default, as TRL's examples do
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(models.policy)
    rewards = []
    if models.reward:
        reward_model = AutoModelForSequenceClassification.from_pretrained(models.reward)
        if reward_model.config.num_labels != 1:
            raise ValueError(f"reward model {models.reward!r} has {reward_model.config.num_labels} labels; "
                             "the RLHF recipe expects a scalar reward model (num_labels=1)")
        reward_tokenizer = AutoTokenizer.from_pretrained(models.reward)
        rewards.append(ClassifierReward(reward_model, reward_tokenizer, pair=models.pair,
                                        max_length=models.reward_max_length, name="reward_model"))
    if models.reward_fn:
        rewards.append(import_reward_function(models.reward_fn))
    return policy, tokenizer, rewards[0] if len(rewards) == 1 else WeightedSum(rewards)


def lora_config(lora: LoRAOptions):
    from peft import LoraConfig

    targets = lora.lora_target_modules
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    return LoraConfig(task_type="CAUSAL_LM", r=lora.lora_r, lora_alpha=lora.lora_alpha,
                      lora_dropout=lora.lora_dropout, target_modules=targets)


def run_rlhf(opts, print_fn=print) -> dict:
    import torch
    from accelerate import PartialState
    from datasets import Dataset

    backend = opts.run.backend
    if opts.train.separate_critic:
        raise ValueError("the RLHF recipe shares the LoRA backbone between policy and value head; "
                         "separate_critic is not supported here")
    if backend == "trl":
        from trl_ext.trl_compat import require_trl_ppo

        require_trl_ppo()
    state = PartialState(cpu=not torch.cuda.is_available())
    prompts = load_prompts(opts.data.prompts)
    policy, tokenizer, reward_fn = load_models(opts.models)
    if state.is_main_process:
        prepare_out_dir(opts.output.out, opts.output.overwrite)
    state.wait_for_everyone()
    tokenizer.truncation_side = "left"
    ids = tokenizer(prompts, truncation=True, max_length=opts.data.max_prompt_length)["input_ids"]
    dataset = Dataset.from_dict({"prompt": prompts, "input_ids": ids})
    need = opts.train.total_episodes
    dataset = dataset.select([i % len(dataset) for i in range(need)])  # cycle the prompts to the budget
    ppo_cfg = train_options(opts)
    history: list[dict] = []
    out = Path(opts.output.out)
    if backend == "trl":
        from transformers import TrainerCallback

        from trl_ext.trl_compat.backend import build_trl_trainer, save_trl_policy

        class _Log(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "objective/scores" in logs:
                    history.append({k: v for k, v in logs.items() if isinstance(v, (int, float))})

        trainer = build_trl_trainer(ppo_cfg, policy, tokenizer, reward_fn, dataset, out, callbacks=[_Log()],
                                    peft_config=lora_config(opts.lora))
        trainer.train()
        save_trl_policy(trainer, tokenizer, out)
        accelerator = trainer.accelerator
    else:
        from trl_ext.ppo.trainer import PPOTrainer

        # The reference is the policy with its LoRA adapters disabled: no second copy of the base model.
        trainer = PPOTrainer(policy, reward_fn, args=ppo_cfg, train_dataset=dataset, processing_class=tokenizer,
                             peft_config=lora_config(opts.lora))
        history = [{k: v for k, v in h.items() if isinstance(v, (int, float))} for h in trainer.train()]
        trainer.save(out)
        accelerator = trainer.accelerator
    summary = {"backend": backend, "config": options_dict(opts), "updates": len(history),
               "first_score": history[0].get("objective/scores") if history else None,
               "last_score": history[-1].get("objective/scores") if history else None,
               "world_size": accelerator.num_processes}
    if accelerator.is_main_process:
        (out / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["summary"] = (f"rlhf[{backend}]: {len(history)} updates, reward score "
                          f"{summary['first_score']} -> {summary['last_score']}; LoRA adapter in {out}")
    return summary


def rlhf_command(opts) -> CommandResult:
    summary = run_rlhf(opts)
    return CommandResult(summary["summary"], summary)


COMMAND = Command(
    help="real-LLM PPO with LoRA and a scalar reward model (and/or your reward function)",
    parts={"train": PPOConfig, "models": RLHFModels, "data": PromptOptions, "lora": LoRAOptions,
           "output": OutputOptions, "run": RLHFBackend},
    run=rlhf_command, defaults=RLHF_DEFAULTS,
)
