"""Pretrain the tiny GPT-2 policy on no-prefix doubling data (seed 000).

    python recipes/doubling/pretrain.py --out runs/policy
    python recipes/doubling/pretrain.py --config recipes/doubling/pretrain.yaml

A 210k-parameter model: one process is the right size; the command is the same as
``trl-ext pretrain``.
"""

import sys

from trl_ext.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["pretrain", *sys.argv[1:]]))
