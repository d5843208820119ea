"""Real-LLM PPO with LoRA: a Qwen-class policy, a DeBERTa-class reward model (seeds 001-004).

With a Qwen2.5-0.5B-Instruct checkout and OpenAssistant's DeBERTa-v3 reward model on disk:
    accelerate launch --config_file recipes/accelerate/single_gpu.yaml recipes/rlhf/ppo_rlhf.py \\
        --policy /models/Qwen2.5-0.5B-Instruct --reward /models/reward-model-deberta-v3-base \\
        --prompts recipes/rlhf/prompts.jsonl --out runs/rlhf --save-steps 20 --report-to tensorboard

The scratch trainer is the default (any TRL); TRL 1.12's PPOTrainer: --backend trl (the trl-ppo
extra). Several GPUs: multi_gpu.yaml; sharded: deepspeed_zero2.yaml / deepspeed_zero3.yaml / fsdp.yaml
(the rollout gathers sharded parameters once); bf16 comes from the config files' mixed_precision.
Your own reward function instead of, or besides, the reward model: --reward-fn my_rewards.py:fn.
The whole pipeline (SFT -> reward model from preferences -> PPO), each stage reused when finished:
    python recipes/rlhf/ppo_rlhf.py --policy /models/Qwen2.5-0.5B --sft-data recipes/rlhf/sft.jsonl \
        --preferences recipes/rlhf/preferences.jsonl --reward-base /models/deberta-v3-base \
        --prompts recipes/rlhf/prompts.jsonl --out runs/rlhf_all
Options can come from --config FILE.yaml. The policy and value head share one LoRA-adapted backbone;
the reference is the same model with its adapters off.
The tests run this script with tiny, randomly initialised Qwen2 and DeBERTa-v2 models.
"""

import sys

from trl_ext.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["rlhf", *sys.argv[1:]]))
