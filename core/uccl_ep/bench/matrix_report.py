"""Reports of `uccl-ep bench --matrix`: merged rows, the table, the JSON file and the plot.

Row keys (JSON): mode, op, dtype, run (``24 SMs`` / ``eager`` / ``graph``), tokens, hidden, topk,
experts, backend, ranks, verified (``ok``, ``skipped`` or ``FAILED: ...``), note (why a row or
part of it was skipped or cut); uccl-ep: bytes, time_s, synced_s, gbps; NCCL all-to-all of the
same bytes: baseline, baseline_s, baseline_gbps, ratio (its time / ours); DeepEP when it ran:
deepep_bytes, deepep_s, deepep_synced_s, deepep_gbps, deepep_verified, deepep_note and vs_deepep
(our GB/s / DeepEP's, each by DeepEP's byte formula from its own outputs; > 1 = uccl-ep faster).
Times and bytes are per rank, averaged over the ranks.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

__all__ = ["derive", "merge_ranks", "print_table", "write_json", "plot", "PlotUnavailable"]

_AVERAGED = ("time_s", "synced_s", "baseline_s", "bytes", "deepep_s", "deepep_synced_s", "deepep_bytes")


def derive(row: dict) -> dict:
    """GB/s and ratios from a row's times and bytes (absent parts stay absent)."""
    t, b = row.get("time_s", 0.0), row.get("bytes", 0.0)
    if t > 0:
        row["gbps"] = b / 1e9 / t
        if row.get("baseline_s"):
            row["baseline_gbps"] = b / 1e9 / row["baseline_s"]
            row["ratio"] = row["baseline_s"] / t
    dt = row.get("deepep_s", 0.0)
    if dt > 0:
        row["deepep_gbps"] = row.get("deepep_bytes", 0.0) / 1e9 / dt
        if t > 0 and row["deepep_gbps"] > 0:
            row["vs_deepep"] = row["gbps"] / row["deepep_gbps"]
    return row


def _worst(values: list[str]) -> str:
    for v in values:
        if v not in ("ok", "skipped"):
            return v
    return "skipped" if "skipped" in values else "ok"


def merge_ranks(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per point and op: times and bytes averaged over the ranks, checks of every rank."""
    merged = []
    for i, row in enumerate(per_rank[0]):
        same = [rows[i] for rows in per_rank]
        out = {k: v for k, v in row.items() if k not in ("gbps", "baseline_gbps", "ratio", "deepep_gbps", "vs_deepep")}
        for key in _AVERAGED:
            if all(key in r for r in same):
                out[key] = sum(r[key] for r in same) / len(same)
            else:
                out.pop(key, None)
        out["verified"] = _worst([r.get("verified", "skipped") for r in same])
        if "deepep_verified" in row:
            out["deepep_verified"] = _worst([r.get("deepep_verified", "skipped") for r in same])
        merged.append(derive(out))
    return merged


def _f(row: dict, key: str, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    v = row.get(key)
    return fmt.format(v * scale) if isinstance(v, (int, float)) and not math.isnan(v) else ""


def print_table(rows: list[dict], title: str, deepep: str) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title=title, caption=f"DeepEP: {deepep}")
    cols = [("mode", "left"), ("op", "left"), ("dtype", "left"), ("run", "left"), ("tokens", "right"),
            ("hidden", "right"), ("top-k/E", "right"), ("µs", "right"), ("GB/s", "right"), ("synced µs", "right"),
            ("NCCL µs", "right"), ("vs NCCL", "right"), ("DeepEP µs", "right"), ("DeepEP GB/s", "right"),
            ("vs DeepEP", "right"), ("verified", "left"), ("DeepEP verified", "left"), ("note", "left")]
    for name, justify in cols:
        table.add_column(name, justify=justify)
    for r in rows:
        ratio = r.get("vs_deepep")
        vs = "" if ratio is None else (f"[green]{ratio:.2f}x[/]" if ratio >= 1.0 else f"[red]{ratio:.2f}x[/]")
        note = "; ".join(s for s in (r.get("note", ""), r.get("deepep_note", "")) if s)
        table.add_row(r["mode"], r["op"], r["dtype"], r["run"], str(r["tokens"]), str(r["hidden"]),
                      f"{r['topk']}/{r['experts']}", _f(r, "time_s", 1e6), _f(r, "gbps", fmt="{:.2f}"), _f(r, "synced_s", 1e6),
                      _f(r, "baseline_s", 1e6), _f(r, "ratio", fmt="{:.2f}x"), _f(r, "deepep_s", 1e6),
                      _f(r, "deepep_gbps", fmt="{:.2f}"), vs, r.get("verified", ""), r.get("deepep_verified", ""), note)
    console = Console()
    if not console.is_terminal:
        console = Console(width=280)  # logs and CI: never truncate the table
    console.print(table)
    console.print(summary(rows))


def summary(rows: list[dict]) -> str:
    """One line: rows measured, skipped, failed; the median and the lowest ratio to DeepEP per mode."""
    done = [r for r in rows if "time_s" in r]
    skipped = [r for r in rows if r.get("verified") == "skipped"]
    failed = [r for r in rows if r.get("verified") not in ("ok", "skipped")]
    parts = [f"{len(done)} rows measured, {len(skipped)} skipped, {len(failed)} failed"]
    for mode in ("ht", "ll"):
        ratios = sorted(r["vs_deepep"] for r in done if r["mode"] == mode and "vs_deepep" in r)
        if ratios:
            parts.append(f"{mode} vs DeepEP: median {ratios[len(ratios) // 2]:.2f}x, lowest {ratios[0]:.2f}x, "
                         f"{sum(v < 1.0 for v in ratios)} of {len(ratios)} below 1.0x")
    return "; ".join(parts)


def write_json(path: str, doc: dict) -> None:
    text = json.dumps(doc, indent=2)
    if path == "-":
        print(text)
        return
    with open(path, "w") as f:
        f.write(text + "\n")


class PlotUnavailable(RuntimeError):
    pass


def _panels(rows: list[dict]) -> dict[tuple, dict[tuple, float]]:
    """{(mode, op, dtype, run): {(tokens, (hidden, topk, experts)): vs_deepep}} of measured rows."""
    panels: dict[tuple, dict[tuple, float]] = {}
    for r in rows:
        key = (r["mode"], r["op"], r["dtype"], r["run"])
        cells = panels.setdefault(key, {})
        cells[(r["tokens"], (r["hidden"], r["topk"], r["experts"]))] = r.get("vs_deepep", float("nan"))
    return panels


def plot(rows: list[dict], path: str, title: str) -> int:
    """Heat maps of the ratio to DeepEP (our GB/s / DeepEP's), one per (mode, op, dtype, run):
    tokens down, (hidden, top-k/experts) across; green above 1.0x, red below, grey where DeepEP
    did not run. Returns the number of cells that carry a ratio."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import TwoSlopeNorm
    except ImportError as e:
        raise PlotUnavailable(f"the plot needs matplotlib ({e}); `pip install matplotlib`, or plot later from the "
                              "JSON file: uccl-ep bench --from-json RUN.json --plot OUT.png") from e
    panels = _panels(rows)
    if not panels:
        raise PlotUnavailable("no rows to plot")
    n = len(panels)
    ncols = min(n, 3)  # normal mode: one line of panels per SM count; low latency: eager, then graph
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 3.2 * nrows + 1), squeeze=False)
    norm = TwoSlopeNorm(vmin=0.25, vcenter=1.0, vmax=2.0)
    cmap = plt.get_cmap("RdYlGn").copy()
    cmap.set_bad("#dddddd")
    filled = 0
    for ax, (key, cells) in zip(axes.flat, panels.items()):
        tokens = sorted({t for t, _ in cells})
        cols = sorted({c for _, c in cells})
        grid = [[cells.get((t, c), float("nan")) for c in cols] for t in tokens]
        ax.imshow([[min(max(v, 0.25), 2.0) if not math.isnan(v) else v for v in row] for row in grid], cmap=cmap,
                  norm=norm, aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    filled += 1
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if v < 0.45 or v > 1.7 else "black")
        ax.set_yticks(range(len(tokens)), [str(t) for t in tokens])
        ax.set_xticks(range(len(cols)), [f"{h}\n{k}/{e}" for h, k, e in cols], fontsize=7)
        ax.set_ylabel("tokens per rank")
        ax.set_title(" ".join(key) + ": uccl-ep / DeepEP", fontsize=9)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return filled


def report_plot(rows: list[dict], path: str, title: str) -> None:
    """`plot` with a clear message instead of a traceback when it cannot be drawn."""
    try:
        n = plot(rows, path, title)
        print(f"uccl-ep bench: plot written to {path} ({n} cells with a DeepEP ratio)")
    except PlotUnavailable as e:
        print(f"uccl-ep bench: no plot: {e}", file=sys.stderr)
