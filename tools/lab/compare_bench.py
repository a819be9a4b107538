"""Trees' `uccl-ep bench --json` rows side by side: the time of every (mode, op, dtype, run) row in
each tree, each tree's ratio to the first ("base" when present) and whether the last ("new") is
within the tolerance of it.

Usage: compare_bench.py DIR [--tol 0.03]   (DIR holds cmp_<tree>_<label>_<rep>.json from
`run_device.sh compare`; the best (lowest) time of a row over its repetitions is compared, because
a slow outlier says something about the machine, not the tree)."""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys


def _rows(path: str):
    with open(path) as f:
        doc = json.load(f)
    return doc["rows"] if isinstance(doc, dict) else doc


def collect(directory: str) -> dict:
    """{(label, mode, op, dtype): {tree: best time_s}} over every cmp_*.json of `directory`."""
    best: dict = {}
    for path in sorted(glob.glob(os.path.join(directory, "cmp_*.json"))):
        m = re.match(r"cmp_([A-Za-z0-9]+)_(.+)_(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        tree, label = m.group(1), m.group(2)
        for r in _rows(path):
            if r.get("verified") not in ("ok", None) or not r.get("time_s"):
                continue
            key = (label, r["mode"], r["op"], r["dtype"])
            slot = best.setdefault(key, {})
            slot[tree] = min(slot.get(tree, float("inf")), float(r["time_s"]))
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--tol", type=float, default=0.03, help="allowed slowdown of new vs base (0.03 = 3 %%)")
    args = ap.parse_args(argv)
    best = collect(args.dir)
    trees = sorted({t for slot in best.values() for t in slot}, key=lambda t: (t != "base", t == "new", t))
    first, last = trees[0], trees[-1]
    print("| run | mode | op | dtype | " + " | ".join(f"{t} µs" for t in trees) + f" | {last}/{first} | within |")
    print("|---" * (6 + len(trees)) + "|")
    worst = 0.0
    for key in sorted(best):
        t = best[key]
        cells = " | ".join(f"{t[n] * 1e6:.1f}" if n in t else "-" for n in trees)
        if first not in t or last not in t:
            print(f"| {' | '.join(key)} | {cells} | - | missing |")
            continue
        ratio = t[last] / t[first]
        worst = max(worst, ratio)
        print(f"| {' | '.join(key)} | {cells} | {ratio:.3f} | {'yes' if ratio <= 1 + args.tol else 'NO'} |")
    print(f"\nslowest {last}/{first}: {worst:.3f} (tolerance {1 + args.tol:.2f})")
    return 0 if best and worst <= 1 + args.tol else 1

if __name__ == "__main__":
    sys.exit(main())
