"""Stored bytes of one rd run over another's at equal dataset PSNR, pack by pack:
`python -m benchmarks rd-compare BEFORE.json AFTER.json` (two `python -m benchmarks rd --json` runs of the same
items, e.g. an older install's and this one's, made one after the other). Prints a markdown table of
after/before bytes of dctdata at 35/40/45 dB per pack (interpolated on each run's Pareto front,
`benchmarks.curves.bytes_at`; "-" where a sweep does not reach the level) and their geometric means.
"""

from __future__ import annotations

import argparse
import json
import math
from types import SimpleNamespace

from benchmarks.curves import bytes_at
from dctdata.errors import DctDataError

LEVELS = (35.0, 40.0, 45.0)


def ratios(before: list[dict], after: list[dict], levels=LEVELS) -> list[tuple[str, list[float]]]:
    """(pack name, after/before bytes at each level, NaN where either sweep misses it) for each pack."""
    if [p["name"] for p in before] != [p["name"] for p in after]:
        raise DctDataError("rd-compare: expected the same packs in both runs. Got different items or modes")
    out = []
    for a, b in zip(before, after):
        pa, pb = ([SimpleNamespace(**q) for q in p["curves"]["dctdata"]] for p in (a, b))
        out.append((a["name"], [bytes_at(pb, lv) / bytes_at(pa, lv) for lv in levels]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks rd-compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("before", help="`python -m benchmarks rd --json` of the earlier code")
    ap.add_argument("after", help="the same of this code")
    args = ap.parse_args(argv)
    runs = [json.load(open(path))["packs"] for path in (args.before, args.after)]
    rows = ratios(*runs)
    print("| pack | " + " | ".join(f"{lv:g} dB" for lv in LEVELS) + " |")
    print("|---|" + "---:|" * len(LEVELS))
    for name, r in rows:
        print(f"| {name} | " + " | ".join("-" if math.isnan(v) else f"{v:.3f}" for v in r) + " |")
    means = []
    for k in range(len(LEVELS)):
        vals = [r[k] for _, r in rows if not math.isnan(r[k])]
        means.append(f"{math.exp(sum(map(math.log, vals)) / len(vals)):.3f}" if vals else "-")
    print("| geometric mean | " + " | ".join(means) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
