"""`uccl-ep bench --matrix` on 2+ GPUs with the cuda backend: one point per mode, every row
verified, the CUDA-graph row measured (not skipped), and where the real DeepEP is on the path
(PYTHONPATH with .anchors/deepep-v1, docs/bench.md) its rows verified beside ours.

Run directly on a GPU machine: python -m pytest core/tests/gpu/test_cuda_bench_matrix.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]


def test_matrix_point_per_mode_on_gpus(tmp_path):
    from uccl_ep.bench.deepep import find_deepep
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, "-m", "uccl_ep.cli.main", "bench", "--backend", "cuda", "--ranks", "2",
                           "--matrix", "--matrix-tokens", "128", "--matrix-hidden", "2048", "--matrix-routing", "6x64",
                           "--matrix-sms", "24", "--iters", "5", "--warmup", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert len(rows) == 3 + 4
    for r in rows:
        assert r["backend"] == "cuda" and r["verified"] == "ok", r
        assert r["time_s"] > 0 and r["baseline"] == "nccl a2a" and r["baseline_s"] > 0
    assert any(r["run"] == "graph" and r["time_s"] > 0 for r in rows)
    if find_deepep().found:  # the real library: same rows, verified, with a ratio
        assert data["deepep_found"], data["deepep"]
        for r in rows:
            assert r["deepep_verified"] == "ok" and r["deepep_s"] > 0 and r["vs_deepep"] > 0, r
    else:
        assert not data["deepep_found"] and all("deepep_s" not in r for r in rows)
