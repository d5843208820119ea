"""The task targets of both PPO backends over 3 seeds, from the default pipeline, in one run.

    OMP_NUM_THREADS=1 python benchmarks/targets.py            # about 25 minutes on 2 CPU cores

Runs ``trl-ext compare`` (defaults, 3 seeds, both backends, no early stop) into runs/targets,
then checks, per seed, on 1,000 held-out prefix prompts:
  trl:     greedy exact >= 0.99 and sampled exact >= 0.95
  scratch: greedy exact >= 0.99 and sampled exact >= 0.97
and the speed targets: scratch episodes/s >= 3x trl's, scratch wall time to greedy 0.99 <= 1/3 of trl's.
Writes benchmarks/results/targets-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLED = {"trl": 0.95, "scratch": 0.97}


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "runs/targets"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--extra", nargs="*", default=[], help="extra trl-ext compare flags")
    args = parser.parse_args(argv)

    from trl_ext.commands.cli import main as cli

    code = cli(["compare", "--out", args.out, "--seeds", str(args.seeds), "--backends", "trl,scratch",
                "--overwrite", *args.extra])
    if code:
        return code
    results = json.loads((Path(args.out) / "results.json").read_text())
    checks = []
    for backend, runs in results["backends"].items():
        for seed, row in enumerate(runs):
            checks.append({"check": f"{backend} seed {seed}: greedy >= 0.99", "value": row["greedy_exact"],
                           "ok": row["greedy_exact"] >= 0.99})
            checks.append({"check": f"{backend} seed {seed}: sampled >= {SAMPLED[backend]}",
                           "value": row["sampled_exact"], "ok": row["sampled_exact"] >= SAMPLED[backend]})
    runs = results["backends"]
    eps = {b: statistics.fmean(r["episodes_per_second"] for r in runs[b]) for b in runs}
    checks.append({"check": "scratch episodes/s >= 3x trl", "value": round(eps["scratch"] / eps["trl"], 2),
                   "ok": eps["scratch"] >= 3 * eps["trl"]})
    reach = {b: [r["seconds_to_target"] for r in runs[b]] for b in runs}
    if all(v is not None for vs in reach.values() for v in vs):
        ratio = statistics.fmean(reach["scratch"]) / statistics.fmean(reach["trl"])
        checks.append({"check": "scratch seconds to 0.99 <= 1/3 of trl", "value": round(ratio, 3),
                       "ok": ratio <= 1 / 3})
    from trl_ext.commands.demo import machine

    info = machine()
    device = "cpu" if info["device"] == "cpu" else "gpu-" + info["device"].replace(" ", "_")
    out = ROOT / "benchmarks" / "results" / f"targets-{device}.json"
    out.write_text(json.dumps({"benchmark": "targets", "machine": info, "checks": checks,
                               "rows": results["rows"]}, indent=2) + "\n")
    for c in checks:
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}  ({c['value']})")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
