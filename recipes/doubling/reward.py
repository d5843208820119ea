"""Train the BERT character-set classifier that serves as the reward model (seed 000).

python recipes/doubling/reward.py --out runs/reward
"""

import sys

from trl_ext.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["train-reward", *sys.argv[1:]]))
