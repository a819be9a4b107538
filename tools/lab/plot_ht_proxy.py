"""GB/s of normal mode through the proxy vs tokens (docs/benchmarks/ht_proxy.png), from the rows of
`uccl-ep bench --mode ht --nodes N --json ...` runs.

    python tools/lab/plot_ht_proxy.py csv run1.json [run2.json ...] > docs/benchmarks/ht_proxy.csv
    python tools/lab/plot_ht_proxy.py plot docs/benchmarks/ht_proxy.csv docs/benchmarks/ht_proxy.png
"""

from __future__ import annotations

import csv
import json
import sys

FIELDS = ["tokens", "sms", "op", "dtype", "time_us", "rdma_gbps", "nccl_us", "nic_model", "nic_of_cap"]


def to_csv(paths: list[str]) -> int:
    out = csv.DictWriter(sys.stdout, FIELDS)
    out.writeheader()
    for path in paths:
        data = json.load(open(path))
        rows = data["rows"] if isinstance(data, dict) else data
        sms = data.get("spec", {}).get("num_sms", "") if isinstance(data, dict) else ""
        for r in rows:
            if r.get("mode") != "ht" or "rdma_gbps" not in r:
                continue
            out.writerow(dict(tokens=r["tokens"], sms=r.get("num_sms", sms), op=r["op"], dtype=r["dtype"],
                              time_us=round(r["time_s"] * 1e6, 1), rdma_gbps=round(r["rdma_gbps"], 1),
                              nccl_us=round(r["baseline_s"] * 1e6, 1), nic_model="nic_gbps" in r,
                              nic_of_cap=round(r.get("nic_of_cap", 0.0), 3)))
    return 0


def plot(csv_path: str, png: str) -> int:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in csv.DictReader(open(csv_path)) if r["nic_model"] == "False"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    series = {("dispatch", "bf16"): ("o", "tab:blue"), ("dispatch", "fp8"): ("s", "tab:green"),
              ("combine", "bf16"): ("^", "tab:red")}
    for (op, dtype), (marker, color) in series.items():
        for sms, line, fill in (("24", "-", color), ("12", "--", "none")):
            pts = sorted((int(r["tokens"]), float(r["rdma_gbps"])) for r in rows
                         if r["op"] == op and r["dtype"] == dtype and str(r["sms"]) == sms)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, ls=line, color=color,
                        markerfacecolor=fill, label=f"{op} {dtype.upper()}, {sms} SMs")
    ax.axhline(60, color="grey", ls=":", lw=1, label="60 GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per rank")
    ax.set_ylabel("GB/s per rank (DeepEP's RDMA formula)")
    ax.set_title("Normal mode through the proxy, 2 x H200 as 2 nodes (hidden 7168, top-8/256)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    return 0


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    sys.exit(to_csv(args) if cmd == "csv" else plot(*args))
