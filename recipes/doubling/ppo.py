"""PPO on the doubling task with either backend (``--backend trl`` or ``--backend scratch``).

One process (CPU or one GPU):
    accelerate launch --config_file recipes/accelerate/single_gpu.yaml recipes/doubling/ppo.py \\
        --backend scratch --policy runs/policy --reward runs/reward --out runs/ppo_scratch

Two CPU processes (gloo; see the note in multi_cpu.yaml on why not ``--cpu``):
    accelerate launch --config_file recipes/accelerate/multi_cpu.yaml recipes/doubling/ppo.py \\
        --backend trl --policy runs/policy --reward runs/reward --out runs/ppo_trl_2cpu

Several GPUs (DDP), DeepSpeed ZeRO-2/3 or FSDP: swap the config file
(multi_gpu.yaml, deepspeed_zero2.yaml, deepspeed_zero3.yaml, fsdp.yaml, multi_node.yaml).
``--batch-size`` is per process: each update uses batch_size x processes rollouts and
``--total-episodes`` counts them all. Options may also come from ``--config recipes/doubling/ppo.yaml``.
"""

import sys

from trl_ext.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["ppo", *sys.argv[1:]]))
