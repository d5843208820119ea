"""Both PPO backends (and optionally TRL's GRPO/RLOO) side by side over several seeds.

    python recipes/doubling/compare.py --out runs/compare --seeds 3
    python recipes/doubling/compare.py --out runs/compare --backends trl,scratch,grpo,rloo

One process: the comparison's timings are only meaningful when each run has the machine
(or the GPU) to itself.
"""

import sys

from trl_ext.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["compare", *sys.argv[1:]]))
