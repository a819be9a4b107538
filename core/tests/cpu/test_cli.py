"""The command line: `uccl-ep bench` verifies and reports; `--dist env` joins a torchrun job;
`uccl-ep doctor` always answers."""

import json
import os
import subprocess
import sys

import pytest

from multirank import free_port

pytestmark = pytest.mark.cpu

SMALL = ["--num-tokens", "24", "--hidden", "256", "--num-experts", "8", "--num-topk", "2", "--iters", "1",
         "--warmup", "0", "--backend", "reference"]
BIN = os.path.dirname(sys.executable)


def _check_rows(rows, ranks, modes=("ht", "ll")):
    assert {r["mode"] for r in rows} == set(modes)
    for r in rows:
        assert r["verified"] == "ok" and r["ranks"] == ranks and r["bytes"] > 0 and r["time_s"] > 0
        assert r["baseline_s"] > 0 and r["gbps"] == pytest.approx(r["bytes"] / 1e9 / r["time_s"])
        assert r["synced_s"] > 0  # the whole-call time, next to DeepEP's back-to-back convention


def test_bench_spawns_cpu_ranks_and_verifies(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "uccl_ep.cli.main", "bench", *SMALL, "--cpu", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gloo a2a" in proc.stdout and "verified" in proc.stdout
    data = json.loads(out.read_text())
    assert data["ranks"] == 2 and len(data["rows"]) == 6
    _check_rows(data["rows"], 2)
    # LogFMT combine: DeepEP's bytes per selection, 10H/8 + H/128 * 4, next to BF16's 2H
    comb = {r["dtype"]: r for r in data["rows"] if r["mode"] == "ll" and r["op"] == "combine"}
    assert comb["logfmt"]["bytes"] * 2 * 256 == comb["bf16"]["bytes"] * (256 * 10 // 8 + 256 // 128 * 4)


def test_bench_joins_torchrun_job(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([os.path.join(BIN, "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()),
                           "-m", "uccl_ep.cli.main", "bench", *SMALL, "--mode", "ll", "--cpu", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    _check_rows(data["rows"], 2, modes=("ll",))


@pytest.mark.parametrize("backend", ["reference", "host"])
def test_bench_fresh_and_worst_dispatch_rows(tmp_path, backend):
    """--ht-dispatch adds dispatch rows with new routing (layout tensors; with num_worst_tokens), each
    checked against the cached dispatch's rows before it is timed; through the proxy (host, 2 nodes)
    they also carry the RDMA-formula fields."""
    out = tmp_path / "bench.json"
    args = [*SMALL[:-1], backend, "--cpu", "--mode", "ht", "--ht-dispatch", "fresh,worst", "--json", str(out)]
    if backend == "host":
        args += ["--nodes", "2"]
    proc = subprocess.run([sys.executable, "-m", "uccl_ep.cli.main", "bench", *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["op"], r["dtype"]) for r in rows] == [
        ("dispatch", "bf16"), ("dispatch", "fp8"), ("combine", "bf16"), ("dispatch-fresh", "bf16"),
        ("dispatch-fresh", "fp8"), ("dispatch-worst", "bf16"), ("dispatch-worst", "fp8")]
    _check_rows(rows, 2, modes=("ht",))
    by = {(r["op"], r["dtype"]): r for r in rows}
    for dtype in ("bf16", "fp8"):  # the same rows moved, whatever the call's kind
        assert by[("dispatch-worst", dtype)]["bytes"] == by[("dispatch", dtype)]["bytes"]
        if backend == "host":
            assert by[("dispatch-fresh", dtype)]["rdma_bytes"] == by[("dispatch", dtype)]["rdma_bytes"] > 0


def test_bench_refuses_an_unknown_dispatch_kind(capsys):
    from uccl_ep.cli.main import main
    assert main(["bench", *SMALL, "--cpu", "--ht-dispatch", "fresh,cold"]) == 2
    err = capsys.readouterr()
    assert "--ht-dispatch" in err.out + err.err and "fresh, worst" in err.out + err.err


def test_doctor_json():
    proc = subprocess.run([sys.executable, "-m", "uccl_ep.cli.main", "doctor", "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["uccl_ep"]["version"]
    assert "reference" in report["backends_registered"]
    assert isinstance(report["verdict"], list) and report["verdict"]
    assert report["libfabric"]["loadable"] in (True, False)
    # this build has torch >= 2.10 beside it, so its torch ops are built and load
    assert report["torch_ops"] == {"loaded": True, "why": None}


def test_help_lists_subcommands():
    proc = subprocess.run([sys.executable, "-m", "uccl_ep.cli.main", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "bench" in proc.stdout and "doctor" in proc.stdout


def test_bench_proxy_hop_fields():
    """The proxy columns: writes per op, mean post->delivery time, submit time, inbox time, and the
    copy kernel's wait and copy time per descriptor and push -> start / seen per launch, between two
    ipc snapshots."""
    from uccl_ep.bench.ep import _proxy_fields, _proxy_snapshot
    counters = {"ipc_post_to_deliver_ns": 5_000_000, "ipc_delivered_to_0": 300, "ipc_delivered_to_1": 700,
                "ipc_copy_bytes": 1, "ipc_submit_ns": 900_000, "ipc_cuda_copies": 600, "ipc_inbox_ns": 70_000,
                "ipc_received": 50}
    after = _proxy_snapshot(lambda: counters)
    assert (after["ipc_post_to_deliver_ns"], after["delivered"], after["ipc_submit_ns"], after["copies"],
            after["ipc_inbox_ns"], after["ipc_received"], after["copy_kernel_descs"]) == (5_000_000, 1000, 900_000,
                                                                                          600, 70_000, 50, 0)
    assert _proxy_snapshot(lambda: {"loop_writes": 3}) is None     # not an ipc transport
    assert _proxy_snapshot(None) is None
    before = _proxy_snapshot(lambda: {"ipc_post_to_deliver_ns": 1_000_000, "ipc_delivered_to_0": 200,
                                      "ipc_submit_ns": 100_000, "ipc_cuda_copies": 200, "ipc_inbox_ns": 10_000,
                                      "ipc_received": 10})
    f = _proxy_fields(before, after, 4)
    assert f == {"proxy_writes": 200.0, "proxy_hop_us": 5.0, "proxy_submit_us": 2.0, "proxy_inbox_us": 1.5}
    # ipc "kernel" copies: the copy kernel's summed wait and copy ns over the descriptors it did, and
    # its per-launch push -> start / push -> seen
    k = dict(counters, ipc_kernel_copies=600, copy_kernel_wait_ns=4_000_000, copy_kernel_copy_ns=1_000_000,
             copy_kernel_descs=100, ipc_ring_done_seen_ns=600_000, ipc_ring_done_seen=100,
             copy_kernel_push_start_ns=(1 << 64) - 300_000, copy_kernel_push_seen_ns=900_000, copy_kernel_launches=60,
             ipc_ring_push_post_ns=(1 << 64) - 80_000, ipc_ring_post_seen_ns=500_000, ipc_ring_taken=50,
             ipc_ring_pushes=50)
    del k["ipc_cuda_copies"]
    before_k = dict(before, copy_kernel_descs=20, ipc_ring_done_seen_ns=200_000, ipc_ring_done_seen=20,
                    copy_kernel_launches=10, ipc_ring_push_post_ns=20_000, ipc_ring_taken=10, ipc_ring_pushes=10)
    g = _proxy_fields(before_k, _proxy_snapshot(lambda: k), 4)
    assert (g["copy_wait_us"], g["copy_us"], g["done_seen_us"]) == (50.0, 12.5, 5.0)
    # an overlapped copy kernel starts before the push (signed): -300 us over 50 launches
    assert (g["push_start_us"], g["push_seen_us"]) == (-6.0, 18.0)
    # signed sums in unsigned words: -80 us summed after +20 us is -100 us over 40 samples
    assert (g["push_post_us"], g["post_seen_us"]) == (-2.5, 12.5)
    assert _proxy_fields(before, before, 4) == {}       # nothing delivered: no columns
    assert _proxy_fields(None, after, 4) == {}


def test_time_op_counts_every_call_and_reports_synced():
    """The proxy columns divide by the calls made, so time_op must count warm-up and synced calls."""
    import torch
    from uccl_ep.bench.timing import time_op
    calls = []
    t = time_op(lambda: calls.append(1), 4, 2, torch.device("cpu"), synced_iters=3)
    assert t["calls"] == len(calls) == 6
    assert {"mean", "median", "min", "max", "synced_mean", "synced_median"} <= set(t)
    assert t["min"] <= t["median"] <= t["max"]
    assert "synced_mean" not in time_op(lambda: None, 2, 0, torch.device("cpu"))
    # on_timed brackets exactly the back-to-back calls
    seen = []
    t = time_op(lambda: calls.append(1), 3, 2, torch.device("cpu"), synced_iters=2,
                on_timed=lambda when: seen.append((when, len(calls))))
    assert seen == [("start", 8), ("end", 11)] and t["timed_calls"] == 3


def test_time_op_times_with_the_garbage_collector_off():
    """A collection's pause must not land in a sample: the collector is off for the timed calls (not
    the warm-up) and back as it was after them, also when a call raises."""
    import gc
    import torch
    from uccl_ep.bench.timing import time_op
    seen = []
    assert gc.isenabled()
    time_op(lambda: seen.append(gc.isenabled()), 3, 2, torch.device("cpu"), synced_iters=1)
    assert seen == [True, True, False, False, False] and gc.isenabled()

    def boom():
        if not gc.isenabled():
            raise RuntimeError("timed call failed")
    with pytest.raises(RuntimeError, match="timed call failed"):
        time_op(boom, 2, 1, torch.device("cpu"))
    assert gc.isenabled()
    gc.disable()
    try:  # a caller that turned it off keeps it off
        time_op(lambda: None, 2, 0, torch.device("cpu"))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_subcommands_of_other_distributions_load_by_entry_point(tmp_path, monkeypatch, capsys):
    """`uccl-ep NAME` for a subcommand another distribution declares in the `uccl_ep.cli` entry point
    group (uccl-ep-deploy's `launch`); a known one that is not installed says where it comes from."""
    from uccl_ep.cli import main as cli
    (tmp_path / "greet_plugin.py").write_text(
        "def add_parser(sub):\n"
        "    p = sub.add_parser('greet')\n"
        "    p.add_argument('who')\n"
        "    p.set_defaults(func=lambda args: print('hello', args.who) or 7)\n")
    info = tmp_path / "greet_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: greet-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[uccl_ep.cli]\ngreet = greet_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["greet", "world"]) == 7 and capsys.readouterr().out == "hello world\n"
    monkeypatch.setattr(cli, "_ELSEWHERE", {"absent": "the uccl-ep-absent distribution"})
    assert cli.main(["absent", "x", "--y"]) == 2
    assert "uccl-ep absent: not installed; it comes with the uccl-ep-absent distribution" in capsys.readouterr().err
