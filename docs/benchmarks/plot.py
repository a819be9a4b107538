#!/usr/bin/env python3
"""Benchmark plots for docs/: bars of normal-mode GB/s and low-latency µs per series (the `backend`
column names what ran), from docs/benchmarks/data.csv, which holds the current figures (one row per
series and op; benchmark runs can append to it):

    uccl-ep bench --json run.json ...                          # any machine
    python docs/benchmarks/plot.py append run.json --machine "2x H200 NVLink" [--nodes 1]
    python docs/benchmarks/plot.py [--data data.csv] [--out docs/benchmarks]   # ht.png, ll.png

A series (machine x backend) with no rows for a panel is simply absent from it; a panel with no
data at all says so instead of failing, so partial data never breaks the docs build.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIELDS = ["date", "machine", "backend", "mode", "op", "dtype", "ranks", "nodes", "tokens", "hidden", "topk",
          "experts", "time_us", "gbps", "baseline", "baseline_us", "source"]
PANELS = {"ht": ("Normal (high-throughput) mode", "gbps", "GB/s per rank (higher is better)"),
          "ll": ("Low-latency mode", "time_us", "µs per call (lower is better)")}


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def append(bench_json: Path, data: Path, machine: str, nodes: int, source: str) -> int:
    """Rows of `uccl-ep bench --json` -> CSV rows (one per mode/op/dtype)."""
    run = json.loads(bench_json.read_text())
    new = []
    for r in run["rows"]:
        new.append({"date": datetime.date.today().isoformat(), "machine": machine, "backend": r["backend"],
                    "mode": r["mode"], "op": r["op"], "dtype": r["dtype"], "ranks": r["ranks"], "nodes": nodes,
                    "tokens": r["tokens"], "hidden": r["hidden"], "topk": r["topk"], "experts": r["experts"],
                    "time_us": f"{r['time_s'] * 1e6:.1f}", "gbps": f"{r['gbps']:.3f}",
                    "baseline": r.get("baseline", ""),
                    "baseline_us": f"{r['baseline_s'] * 1e6:.1f}" if r.get("baseline_s") else "",
                    "source": source})
    exists = data.exists()
    with open(data, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if not exists:
            w.writeheader()
        w.writerows(new)
    print(f"appended {len(new)} rows to {data}")
    return 0


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def plot(rows: list[dict[str, str]], out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for mode, (title, metric, ylabel) in PANELS.items():
        # series = backend (the label of what ran); categories = op/dtype; the latest row wins
        values: dict[str, dict[str, float]] = defaultdict(dict)
        machines = set()
        for r in sorted(rows, key=lambda r: r.get("date", "")):
            v = _number(r.get(metric, ""))
            if r.get("mode") != mode or v is None:
                continue
            values[r["backend"]][f"{r['op']} {r['dtype']}".strip()] = v
            machines.add(r["machine"])
        fig, ax = plt.subplots(figsize=(8, 4))
        cats = sorted({c for s in values.values() for c in s})
        if not cats:
            ax.text(0.5, 0.5, f"no {mode} data yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        else:
            colors = plt.get_cmap("tab10").colors  # one distinct colour per series
            width = 0.8 / max(sum(cat in d for d in values.values()) for cat in cats)
            for i, (series, data) in enumerate(sorted(values.items())):
                xs, ys = [], []
                for c, cat in enumerate(cats):  # bars of a category centred on it, series that have it only
                    if cat in data:
                        present = [s for s in sorted(values) if cat in values[s]]
                        xs.append(c + (present.index(series) - (len(present) - 1) / 2) * width)
                        ys.append(data[cat])
                bars = ax.bar(xs, ys, width, label=series, color=colors[i % len(colors)])
                ax.bar_label(bars, fmt="%.0f", fontsize=7)
            ax.set_xticks(range(len(cats)), cats, fontsize=8)
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=7)
        ax.set_title(f"{title} ({'; '.join(sorted(machines))})" if machines else title, fontsize=10)
        fig.tight_layout()
        path = out / f"{mode}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default="plot", choices=["plot", "append"])
    ap.add_argument("bench_json", nargs="?", help="append: the file `uccl-ep bench --json` wrote")
    ap.add_argument("--data", type=Path, default=HERE / "data.csv")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--machine", help="append: e.g. '2x p5en (16x H200, EFA)'")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--source", default="uccl-ep bench")
    a = ap.parse_args(argv)
    if a.command == "append":
        if not a.bench_json or not a.machine:
            ap.error("append needs BENCH_JSON and --machine")
        return append(Path(a.bench_json), a.data, a.machine, a.nodes, a.source)
    a.out.mkdir(parents=True, exist_ok=True)
    for p in plot(read_rows(a.data), a.out):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
