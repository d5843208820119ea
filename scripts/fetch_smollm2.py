"""``python scripts/fetch_smollm2.py [--out DIR]``: ``scripts/fetch_model.py SmolLM2-135M-Instruct``, kept for the
commands and docs that name it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_model import main  # noqa: E402 - a script beside this one, not a package

if __name__ == "__main__":
    sys.exit(main(["SmolLM2-135M-Instruct", *sys.argv[1:]]))
