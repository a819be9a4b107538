"""docs/benchmarks/plot.py: plots from the shipped data, from data with series missing, and the
append path from `uccl-ep bench --json` output."""

from __future__ import annotations

import csv
import json

from conftest import OPS_BIN, ROOT, run

PLOT = str(ROOT / "docs" / "benchmarks" / "plot.py")
PY = str(OPS_BIN / "python")


def test_plot_shipped_data(tmp_path):
    p = run([PY, PLOT, "--out", str(tmp_path)], 180)
    assert p.returncode == 0, p.stdout
    for name in ("ht.png", "ll.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_with_missing_series_and_append(tmp_path):
    data = tmp_path / "data.csv"
    with open(ROOT / "docs" / "benchmarks" / "data.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["mode"] == "ht"]  # no low-latency series at all
    with open(data, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    bench = tmp_path / "run.json"
    bench.write_text(json.dumps({"rows": [{"backend": "host", "mode": "ht", "op": "dispatch", "dtype": "bf16",
                                           "ranks": 2, "tokens": 128, "hidden": 512, "topk": 8, "experts": 16,
                                           "time_s": 0.002, "gbps": 0.1, "baseline": "gloo a2a",
                                           "baseline_s": 0.0005}]}))
    p = run([PY, PLOT, "append", str(bench), "--data", str(data), "--machine", "CI lab", "--nodes", "2"], 60)
    assert p.returncode == 0, p.stdout
    with open(data) as f:
        last = list(csv.DictReader(f))[-1]
    assert (last["machine"], last["backend"], last["nodes"], last["time_us"]) == ("CI lab", "host", "2", "2000.0")
    p = run([PY, PLOT, "--data", str(data), "--out", str(tmp_path / "out")], 180)
    assert p.returncode == 0 and (tmp_path / "out" / "ll.png").exists(), p.stdout
    p = run([PY, PLOT, "--data", str(tmp_path / "absent.csv"), "--out", str(tmp_path / "empty")], 180)
    assert p.returncode == 0 and (tmp_path / "empty" / "ht.png").exists(), p.stdout
