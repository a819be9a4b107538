"""The lab tools' own logic, without a GPU: what they read and what they would build, and that the
device script names only files that exist."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1]
ROOT = LAB.parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"lab_{name}", LAB / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summary_table_reads_the_bench_json_by_file_name(tmp_path):
    mod = _load("summarize_ht_tune")
    rows = [dict(mode="ht", op="dispatch", dtype="bf16", gbps=347.0, baseline_gbps=400.0, verified="ok"),
            dict(mode="ht", op="dispatch", dtype="fp8", gbps=118.0, baseline_gbps=350.0, verified="ok"),
            dict(mode="ht", op="combine", dtype="bf16", gbps=296.0, baseline_gbps=450.0, verified="ok")]
    for label, sms in (("reg24", 24), ("reg24", 8), ("d16c16", 24)):
        (tmp_path / f"ht_tune_{label}_{sms}.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "ht_tune_reg24_tests.log").write_text("not json")
    lines = mod.table(mod.load(tmp_path)).splitlines()
    assert [ln.split("|")[1:3] for ln in lines[2:]] == [[" d16c16 ", " 24 "], [" reg24 ", " 24 "], [" reg24 ", " 8 "]]
    assert "| 347.0 | 118.0 | 296.0 | 1.00x / 0.50x / 1.00x | 400.0 / 350.0 / 450.0 | ok |" in lines[2]
    assert mod.main(["x", str(tmp_path / "none")]) == 1


def test_precompile_builds_what_the_engine_loads():
    """--ht: per configuration the dispatch and combine builds with the block size the engine derives
    from the warps (whole warps per peer) and the configuration's -D settings after the engine's own."""
    mod = _load("precompile")
    jobs = mod.ht_jobs(4, "a:16:;b:16/24:UCCL_EP_HT_COMBINE_STAGES=0; ")
    assert jobs == [
        ("ht/nvlink/dispatch.cu", ("UCCL_EP_HT_THREADS=512",)),
        ("ht/nvlink/combine.cu", ("UCCL_EP_RANKS=4", "UCCL_EP_HT_THREADS=512")),
        ("ht/nvlink/dispatch.cu", ("UCCL_EP_HT_THREADS=512", "UCCL_EP_HT_COMBINE_STAGES=0")),
        ("ht/nvlink/combine.cu", ("UCCL_EP_RANKS=4", "UCCL_EP_HT_THREADS=768", "UCCL_EP_HT_COMBINE_STAGES=0")),
    ]
    assert mod.ht_jobs(3, "x:16:")[0] == ("ht/nvlink/dispatch.cu", ("UCCL_EP_HT_THREADS=480",))


def test_device_script_names_existing_files():
    """Every repository path run_device.sh runs or reads (scripts, tests, kernel sources) exists."""
    text = (LAB / "run_device.sh").read_text()
    paths = set(re.findall(r"\b((?:tools/lab|core/tests/gpu|core/tests)/[\w/]+\.(?:py|sh))", text))
    assert {"tools/lab/precompile.py", "tools/lab/summarize_ht_tune.py"} <= paths
    missing = sorted(p for p in paths if not (ROOT / p).is_file())
    assert not missing, missing
    kernels = {m for line in text.splitlines() if "precompile.py" in line or line.strip().startswith(("ht/",))
               for m in re.findall(r"(?<![\w/])([\w/]+\.cu)\b", line)}
    assert kernels and all((ROOT / "core" / "kernels" / k).is_file() for k in kernels), kernels


def test_core_gpu_folder_holds_tests_only():
    gpu = ROOT / "core" / "tests" / "gpu"
    others = sorted(p.name for p in gpu.iterdir() if p.is_file() and not re.fullmatch(r"test_\w+\.py", p.name))
    assert not others, f"lab tools belong in tools/lab: {others}"


def test_cubin_hashes_cover_every_source_and_the_engines_defines():
    mod = _load("cubin_hashes")
    kernels = ROOT / "core" / "kernels"
    jobs = mod.jobs(kernels)
    assert {s for s, d in jobs if not d} == {p.relative_to(kernels).as_posix() for p in kernels.rglob("*.cu")}
    assert ("ht/nvlink/combine.cu", ("UCCL_EP_RANKS=8", "UCCL_EP_HT_THREADS=512")) in jobs
    assert len(jobs) == len(set(jobs))


def test_probe_kernels_live_in_the_lab_and_build_there():
    """The copy ring's probe kernels are lab sources (never in the package's kernel tree), and
    lab_kernels builds them against that tree and packs their structs from the lab source."""
    names = ("ll_proxy_dma_probe", "ll_proxy_rtt_probe", "CopyProbeParams", "ProxyRttProbeParams")
    in_code = [str(p.relative_to(ROOT)) for p in (ROOT / "core" / "kernels").rglob("*") if p.is_file()
               for line in p.read_text(errors="replace").splitlines()
               if any(n in line.split("//", 1)[0] for n in names)]
    assert not in_code, f"probe kernels or their structs in core/kernels: {sorted(set(in_code))}"
    lab = _load("lab_kernels")
    assert lab.param_struct("probe_copy_ring.cu", "CopyProbeParams") == \
        ("<QQqqq", ("dst", "src", "len", "reps", "fence"))
    fmt, fields = lab.param_struct("probe_copy_ring.cu", "ProxyRttProbeParams")
    assert fields[:2] == ("fifo", "ring") and fields[-1] == "read_mode" and len(fmt) == 1 + len(fields)
    from uccl_ep.cuda import jit
    try:
        jit.find_nvcc()
    except Exception:  # noqa: BLE001
        if os.environ.get("CI"):
            raise
        pytest.skip("nvcc not installed (ci/setup.d/20-gpu-toolchain.sh installs it)")
    image = lab.compile_lab("probe_copy_ring.cu", "sm_90a")
    assert all(f"{n}\0".encode() in image for n in ("ll_proxy_dma_probe", "ll_proxy_rtt_probe"))
