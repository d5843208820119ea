"""Real-LLM PPO with LoRA: a Qwen-class policy, a DeBERTa-class reward model (seeds 001-004).

With a Qwen2.5-0.5B-Instruct checkout and OpenAssistant's DeBERTa-v3 reward model on disk:
    accelerate launch --config_file recipes/accelerate/single_gpu.yaml recipes/rlhf/ppo_rlhf.py \\
        --policy /models/Qwen2.5-0.5B-Instruct --reward /models/reward-model-deberta-v3-base \\
        --prompts recipes/rlhf/prompts.jsonl --out runs/rlhf_trl --backend trl

The in-house trainer instead: --backend scratch. Several GPUs: multi_gpu.yaml; sharded:
deepspeed_zero2.yaml / deepspeed_zero3.yaml / fsdp.yaml. Options can come from --config FILE.yaml.
The policy and value head share one LoRA-adapted backbone; the reference is the base model.
The tests run this script with tiny, randomly initialised Qwen2 and DeBERTa-v2 models.
"""

import sys

from trl_ext.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["rlhf", *sys.argv[1:]]))
