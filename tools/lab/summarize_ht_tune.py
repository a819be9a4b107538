"""Table of the HT tuning matrix written by `run_device.sh tune`.

Reads <dir>/ht_tune_<label>_<sms>.json (uccl-ep bench --json output) and prints one markdown
row per (configuration label, SMs): dispatch BF16 / FP8 and combine GB/s with DeepEP's figures on 2 x H200 as the
reference (docs/benchmarks.md), NCCL's in the same run, and whether the bench verified the results.

Usage: python tools/lab/summarize_ht_tune.py [dir]   (default: $OUT or ./gpu-out)
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

DEEPEP = {("dispatch", "bf16"): 347.0, ("dispatch", "fp8"): 236.0, ("combine", "bf16"): 296.0}
_NAME = re.compile(r"ht_tune_(.+)_(\d+)\.json$")


def load(folder: Path) -> list[tuple[str, int, dict]]:
    out = []
    for path in sorted(folder.glob("ht_tune_*_*.json")):
        m = _NAME.search(path.name)
        if m:
            out.append((m.group(1), int(m.group(2)), json.loads(path.read_text())))
    return sorted(out, key=lambda e: (e[0], -e[1]))


def table(entries: list[tuple[str, int, dict]]) -> str:
    lines = ["| config | SMs | dispatch BF16 GB/s | dispatch FP8 GB/s | combine GB/s | vs DeepEP 347 / 236 / 296 "
             "| NCCL a2a GB/s (BF16 / FP8 / comb.) | verified |", "|---|---|---|---|---|---|---|---|"]
    for label, sms, data in entries:
        rows = {(r["op"], r["dtype"]): r for r in data.get("rows", []) if r.get("mode") == "ht"}
        keys = list(DEEPEP)
        got = [rows.get(k) for k in keys]
        gbps = " | ".join(f"{r['gbps']:.1f}" if r else "-" for r in got)
        ratio = " / ".join(f"{r['gbps'] / DEEPEP[k]:.2f}x" if r else "-" for k, r in zip(keys, got))
        base = " / ".join(f"{r.get('baseline_gbps', 0):.1f}" if r else "-" for r in got)
        ok = ",".join(sorted({r["verified"] for r in got if r})) or "-"
        lines.append(f"| {label} | {sms} | {gbps} | {ratio} | {base} | {ok} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    folder = Path(argv[1] if len(argv) > 1 else os.environ.get("OUT", "gpu-out"))
    entries = load(folder)
    if not entries:
        print(f"no ht_tune_*_*.json under {folder}")
        return 1
    print(table(entries))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
