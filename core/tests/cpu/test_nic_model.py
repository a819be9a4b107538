"""The NIC model decorator (`nic:<model>:<inner>`, UCCL_EP_NIC_MODEL): it caps a loop transport's
throughput at the line rate (one link per NIC, shared by the threads on it), adds its latency to
every message, reorders deliveries like SRD while the proxy's count fence and ordered-write reorder
buffer keep every byte and counter exact (random streams; host executor HT and LL against the
reference), passes node mates through, and rejects a bad parameter with a typed error naming it."""

import argparse
import json
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from multirank import run_ranks
from uccl_ep.errors import InvalidArgument
from uccl_ep.proxy import native, transport_unavailable_reason
from uccl_ep.proxy.nic_model import PRESETS, decorate, parse_nic_model

pytestmark = pytest.mark.cpu


# --------------------------------------------------------------------------------------------------
# specs
# --------------------------------------------------------------------------------------------------
def test_presets_overrides_and_canonical_form():
    m = parse_nic_model("efa-400g")
    assert (m.bw, m.lat_us, m.reorder, m.window_us, m.nics) == (50e9, 10.0, 1.0, 10.0, 1)
    p5en = parse_nic_model("efa-200g,nics=2")
    assert p5en.cap_bytes_per_s == 50e9 and p5en.label == "efa-200g,nics=2"
    assert parse_nic_model("cx7-400g").reorder == 0.0
    m = parse_nic_model("bw=50e9,lat_us=10,reorder=1")
    assert m.window_us == 10.0                       # the window defaults to the latency
    assert parse_nic_model("") is None and parse_nic_model("off") is None
    spec = parse_nic_model("bw=1e20,lat_us=0.5").spec()
    assert ":" not in spec and "+" not in spec       # nests inside transport names
    assert set(PRESETS) >= {"efa-400g", "efa-200g", "cx7-400g"}


def test_decorate_wraps_what_reaches_other_nodes():
    m = parse_nic_model("efa-400g")
    assert decorate("loop", m) == f"nic:{m.spec()}:loop"
    assert decorate("ipc+fabric", m) == f"ipc+nic:{m.spec()}:fabric"
    assert decorate("fault:loop", m) == f"fault:nic:{m.spec()}:loop"
    assert decorate("loop", None) == "loop"
    assert transport_unavailable_reason(decorate("loop", m)) is None
    assert transport_unavailable_reason(decorate("fault:loop", m)) is None
    allrdma = parse_nic_model("efa-400g,mates=1")
    assert allrdma.mates == 1 and ",mates=1," in allrdma.spec() and ",mates=0," in m.spec()
    stacked = parse_nic_model("efa-400g,overlap=0")  # the stand-in's own delivery time adds to lat_us
    assert m.overlap == 1 and m.spec().endswith(",overlap=1") and stacked.spec().endswith(",overlap=0")
    assert transport_unavailable_reason(decorate("loop", stacked)) is None
    assert decorate("ipc", allrdma) == f"nic:{allrdma.spec()}:ipc"
    with pytest.raises(InvalidArgument, match="mates"):  # a split transport's node mates never reach the model
        decorate("ipc+fabric", allrdma)


@pytest.mark.parametrize("spec,key", [
    ("bw=-5", "bw"), ("bw=fast", "bw"), ("lat_us=3", "bw"), ("efa-400g,lat_us=-1", "lat_us"),
    ("efa-400g,reorder=2", "reorder"), ("efa-400g,nics=0", "nics"), ("efa-400g,nics=1.5", "nics"),
    ("efa-400g,window_us=x", "window_us"), ("efa-400g,seed=-1", "seed"), ("bw=inf", "bw"),
    ("efa-400g,lat_us=nan", "lat_us"), ("efa-400g,mates=2", "mates"), ("efa-400g,mates=0.5", "mates"),
    ("efa-400g,overlap=2", "overlap")])
def test_bad_parameter_names_it(spec, key):
    with pytest.raises(InvalidArgument, match=f"UCCL_EP_NIC_MODEL \\({key}\\)"):
        parse_nic_model(spec)


@pytest.mark.parametrize("spec", ["efa-800g", "efa-400g,speed=3", "efa-400g,bw"])
def test_unknown_preset_or_key(spec):
    with pytest.raises(InvalidArgument, match="--nic-model"):
        parse_nic_model(spec, "--nic-model")


def test_native_side_checks_the_spec_too():
    # what reaches the decorator without the Python parser is checked before anything opens
    assert "lat_us" in transport_unavailable_reason("nic:bw=1e9,lat_us=-2:loop")
    assert "unknown parameter" in transport_unavailable_reason("nic:bw=1e9,speed=2:loop")
    assert "nic:<model>:<inner" in transport_unavailable_reason("nic:bw=1e9")
    assert "0 or 1" in transport_unavailable_reason("nic:bw=1e9,mates=3:loop")


# --------------------------------------------------------------------------------------------------
# rate, latency, reordering through real proxies (2 processes, loop transport, 1 rank per node)
# --------------------------------------------------------------------------------------------------
WRITE = 1 << 16
SLOTS = 16


def _rate_worker(rank, world, cases):
    from uccl_ep.proxy import start_proxy
    try:  # a bad model is refused before the bootstrap, naming the argument and the key
        start_proxy(dist.group.WORLD, region_bytes=1 << 16, num_counters=4, transport="loop",
                    nic_model="efa-400g,reorder=7")
        out = ["no error"]
    except InvalidArgument as e:
        out = [str(e)]
    for model, threads, writes, rpn in cases:
        p = start_proxy(dist.group.WORLD, region_bytes=2 * SLOTS * WRITE + 4096, num_counters=16, transport="loop",
                        num_threads=threads, fifos_per_thread=1, timeout_s=60.0, ranks_per_node=rpn, nic_model=model)
        try:
            dist.barrier()
            if rank == 0:
                n, seconds = p.run_load(p.num_fifos, writes // p.num_fifos, dst=1, write_bytes=WRITE, src_off=0,
                                        dst_off=SLOTS * WRITE, slots=SLOTS, fence=True, timeout_s=60.0)
                c = dict(p.transport_counters())
                out.append((p.transport_name, writes * WRITE / seconds, c.get("nic_model_bytes", 0),
                            c.get("nic_model_overtaken", 0)))
            dist.barrier()
        finally:
            p.stop()
    return out


def test_rate_is_capped_per_nic_shared_by_its_threads():
    cap = 100e6  # bytes/s: far below what the loop transport moves here
    cases = [("", 1, 512, 1),                                # the machine: well above the cap
             (f"bw={cap:g}", 1, 512, 1),                       # one thread, one NIC
             (f"bw={cap:g}", 2, 512, 1),                       # two threads on one NIC: still one link
             (f"bw={cap:g},nics=2", 2, 1024, 1),               # two threads, two NICs: twice the rate
             (f"bw={cap:g}", 1, 512, 2),                       # one node: no NIC in the way
             (f"bw={cap:g},mates=1", 1, 512, 2)]               # one node, all through the NIC (all-RDMA)
    refused, *rows = run_ranks(_rate_worker, 2, cases, timeout_s=120)[0]
    assert "`nic_model (reorder)`" in refused
    free, one, shared, two, mates, allrdma = [r[1] for r in rows]
    print(f"MB/s at a cap of {cap / 1e6:g}: none {free / 1e6:.0f}, 1 thread {one / 1e6:.1f}, 2 threads on one NIC "
          f"{shared / 1e6:.1f}, 2 threads on 2 NICs {two / 1e6:.1f}, node mates {mates / 1e6:.0f}")
    assert free > 3 * cap, f"the loop transport is too slow here to test a cap of {cap:g} B/s: {free:g}"
    assert mates > 3 * cap and rows[4][2] == 0, rows[4]
    assert 0.8 * cap < allrdma <= 1.02 * cap and rows[5][2] == 512 * WRITE, rows[5]
    assert 0.8 * cap < one <= 1.02 * cap, one
    assert 0.8 * cap < shared <= 1.02 * cap, shared
    assert 1.6 * cap < two <= 2.04 * cap, two
    assert rows[1][0].startswith("nic:bw=100000000,") and rows[1][0].endswith(":loop")
    assert rows[1][2] == 512 * WRITE                   # every byte went through the model
    assert all(r[3] == 0 for r in rows)                # reorder=0: released in posting order


def _ping_pong(p, C, rank, rounds, ping=0, pong=0):
    """Rounds of zero-byte messages: rank 0 bumps counter `ping` at rank 1, which answers on `pong`."""
    for i in range(rounds):
        if rank == 0:
            p.push(0, *C.encode_atomic(1, ping, 1, False), 10.0)
            p.wait_counter(1, pong, i + 1, 10.0, "pong")
        else:
            p.wait_counter(0, ping, i + 1, 10.0, "ping")
            p.push(0, *C.encode_atomic(0, pong, 1, False), 10.0)


def _pingpong_worker(rank, world, models, rounds):
    from uccl_ep.proxy import native, start_proxy
    C = native()
    out = []
    for model in models:
        p = start_proxy(dist.group.WORLD, region_bytes=1 << 16, num_counters=4, transport="loop", num_threads=1,
                        timeout_s=60.0, ranks_per_node=1, nic_model=model)
        try:
            dist.barrier()
            t0 = time.perf_counter()
            _ping_pong(p, C, rank, rounds)
            out.append((time.perf_counter() - t0) / rounds)
            dist.barrier()
        finally:
            p.stop()
    return out


def test_latency_is_added_to_every_message():
    """A round trip of two zero-byte messages: the machine's, then with 3 ms of one-way latency."""
    lat_us = 3000.0
    base, rtt = run_ranks(_pingpong_worker, 2, ["", f"bw=1e9,lat_us={lat_us}"], 10, timeout_s=120)[0]
    print(f"round trip: {base * 1e6:.0f} us without the model, {rtt * 1e6:.0f} us with lat_us={lat_us:g}")
    assert 2 * lat_us * 1e-6 <= rtt <= 2 * lat_us * 1e-6 + base + 3e-3, (rtt, base)


def _data_pingpong_worker(rank, world, models, rounds, nbytes):
    """Rounds of one data Write each way (ordered immediate on counter 0, +1 each): the round trip time."""
    from uccl_ep.proxy import native, start_proxy
    C = native()
    out = []
    for model in models:
        p = start_proxy(dist.group.WORLD, region_bytes=4 * nbytes, num_counters=4, transport="ipc", num_threads=1,
                        timeout_s=60.0, ranks_per_node=1, nic_model=model)
        try:
            dist.barrier()
            t0 = time.perf_counter()
            for i in range(rounds):
                if rank == 0:
                    p.push(0, *C.encode_ordered_write(1, 0, 2 * nbytes, nbytes, 0, 1), 10.0)
                    p.wait_counter(1, 0, i + 1, 10.0, "pong")
                else:
                    p.wait_counter(0, 0, i + 1, 10.0, "ping")
                    p.push(0, *C.encode_ordered_write(0, 0, 2 * nbytes, nbytes, 0, 1), 10.0)
            out.append((time.perf_counter() - t0) / rounds)
            dist.barrier()
        finally:
            p.stop()
    return out


def test_overlapped_data_write_arrives_no_earlier_than_the_model_says():
    """overlap=1 hands a Write's bytes to the inner transport as they leave the modelled link (with
    reordering: as it is posted) and its immediate at its due time: a data round trip still takes at
    least two link times plus two latencies."""
    lat_us, nbytes, bw = 2000.0, 1 << 16, 1e8   # 655 us on the link each way
    floor_s = 2 * (lat_us * 1e-6 + nbytes / bw)
    models = [f"bw={bw:g},lat_us={lat_us:g}", f"bw={bw:g},lat_us={lat_us:g},overlap=0",
              f"bw={bw:g},lat_us={lat_us:g},reorder=1,window_us=100"]
    overlapped, stacked, reordered = run_ranks(_data_pingpong_worker, 2, models, 6, nbytes, timeout_s=120)[0]
    print(f"data round trip: {overlapped * 1e6:.0f} us overlapped, {stacked * 1e6:.0f} us stacked, "
          f"{reordered * 1e6:.0f} us reordered (floor {floor_s * 1e6:.0f})")
    assert floor_s <= overlapped <= floor_s + 3e-3, overlapped
    assert floor_s <= stacked <= floor_s + 3e-3, stacked
    assert floor_s <= reordered <= floor_s + 200e-6 + 3e-3, reordered


def _streams_worker(rank, world, model, rpn, rounds, transport="loop"):
    from uccl_ep import proxy
    from uccl_ep.proxy.streams import StreamSpec, region_bytes_for, run_streams
    spec = StreamSpec(seed=41)
    p = proxy.start_proxy(dist.group.WORLD, region_bytes=region_bytes_for(spec, world), num_counters=spec.num_counters,
                          transport=transport, num_threads=2, timeout_s=60, ranks_per_node=rpn, nic_model=model)
    try:
        n = run_streams(rank, world, p, spec, rounds=rounds, timeout_s=60)
        return n, dict(p.transport_counters()), p.transport_name
    finally:
        p.stop()


def test_reordered_streams_stay_exact():
    """SRD-like reordering (every message, a window far above the latency), 2 ranks as 2 nodes; the
    streams check every byte and counter."""
    model = "bw=2e9,lat_us=20,reorder=1,window_us=400,seed=5"
    for n, c, _ in run_ranks(_streams_worker, 2, model, 1, 3, timeout_s=240):
        assert n > 300
        assert c["nic_model_overtaken"] > 0 and c["nic_model_held_completions"] > 0, c


@pytest.mark.parametrize("overlap", [1, 0])
def test_reordered_streams_over_ipc_stay_exact(overlap):
    """Over ipc (host copies), 2 nodes of 2 ranks: with overlap a Write's bytes and its immediate go
    to ipc as two writes; control messages (atomics, credits) go ahead of copies in flight
    (write_control) as on SRD. Every byte and counter is checked."""
    model = f"bw=2e9,lat_us=20,reorder=1,window_us=200,seed=9,overlap={overlap}"
    for n, c, name in run_ranks(_streams_worker, 4, model, 2, 3, "ipc", timeout_s=240):
        assert n > 200 and name.startswith("nic:") and name.endswith(f"overlap={overlap}:ipc:host"), name
        assert c["nic_model_overtaken"] > 0 and c["nic_model_writes"] > 0, c
        assert c["ipc_controls_ahead"] > 0, c
        assert (c["nic_model_split_writes"] > 0) == bool(overlap), c
        if not overlap:  # (whether an immediate waits for its bytes here depends on the host's speed)
            assert c["nic_model_parked_immediates"] == 0, c


def test_immediates_that_wait_for_their_bytes_stay_exact():
    """With reordering a split Write's bytes go at posting; at no latency its immediate is due at once,
    before loop (the receiver copies) can complete the bytes, so every one waits ("parks") and goes
    when they complete. The streams check every byte and counter."""
    model = "bw=1e12,lat_us=0,reorder=1,window_us=0,seed=7"
    for n, c, _ in run_ranks(_streams_worker, 2, model, 1, 2, timeout_s=240):
        assert n > 200
        assert c["nic_model_split_writes"] > 0 and c["nic_model_parked_immediates"] > 0, c


def test_refused_bytes_of_a_parked_write_are_its_one_completion():
    """With reordering a split Write's bytes go at posting and its immediate, once due, waits for
    them (parked); bytes the receiver refuses after that (loop checks the range there) become the
    Write's one completion: the proxy fails with the receiver's words and nothing lands."""
    from test_proxy import expect_refused_write, make_group, stop_all
    # due at once (no latency, no window): the immediate is due before loop can complete the bytes
    ps = make_group(2, "nic:bw=1e12,lat_us=0,reorder=1,window_us=0:loop", check_remote_bounds=False,
                    ranks_per_node=1)
    try:
        c = expect_refused_write(ps)
        assert c["nic_model_split_writes"] == 1 and c["nic_model_parked_immediates"] == 1, c
    finally:
        stop_all(ps)


# --------------------------------------------------------------------------------------------------
# the host executor's HT and LL protocols under the model, against the reference
# --------------------------------------------------------------------------------------------------
def _executor_worker(rank, world, rpn, seed):
    from uccl_ep import Buffer
    from test_host_executor import HT_CASES, LL_CASES, _diff, _ht_inputs, _ht_run, _ll_run
    import torch
    problems = []
    nvl, rdma = 64 << 20, 32 << 20
    bufs = [Buffer(dist.group.WORLD, nvl, rdma, backend=b, explicitly_destroy=True, ranks_per_node=rpn)
            for b in ("host", "reference")]
    for i, case in enumerate(HT_CASES[:2] + ["fp8"]):
        x, topk, w, E = _ht_inputs(case, rank, world, seed + i)
        a, b = (_ht_run(buf, case, x, topk, w, E, world, seed + i, rank) for buf in bufs)
        for k in a:
            _diff(a[k], b[k], f"ht.{case}.{k}", problems)
    T, H, E, K = 24, 512, 4 * world, 4
    hint = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    ll = [Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=E // world, backend=b,
                 explicitly_destroy=True, ranks_per_node=rpn) for b in ("host", "reference")]
    for i, c in enumerate(LL_CASES[:2]):
        g = torch.Generator().manual_seed((seed + i) * 1000 + rank)
        n = int(torch.randint(1, T + 1, (1,), generator=g))
        x = torch.randn(n, H, generator=g).bfloat16()
        topk = torch.rand(n, E, generator=g).topk(K, dim=1).indices
        w = torch.rand(n, K, generator=g)
        a, b = (_ll_run(buf, c, x, topk, w, T, E, rank, world) for buf in ll)
        for k in a:
            _diff(a[k], b[k], f"ll.{c['name']}.{k}", problems)
    counters = [dict(buf._executor.proxy.transport_counters()) for buf in (bufs[0], ll[0])]
    names = [buf._executor.proxy.transport_name for buf in (bufs[0], ll[0])]
    for buf in bufs + ll:
        buf.destroy()
    return problems, counters, names


def test_host_executor_ht_and_ll_exact_under_the_model():
    env = {"UCCL_EP_NIC_MODEL": "bw=1e9,lat_us=30,reorder=1,window_us=300,seed=3", "UCCL_EP_TRANSPORT": "loop"}
    for problems, counters, names in run_ranks(_executor_worker, 2, 1, 71, timeout_s=300, env=env):
        assert problems == [], problems[:5]
        assert all(n.startswith("nic:") for n in names), names
        assert all(c["nic_model_writes"] > 0 for c in counters), counters


SMALL = ["--num-tokens", "48", "--hidden", "256", "--num-experts", "8", "--num-topk", "2", "--iters", "1",
         "--warmup", "0", "--backend", "host", "--cpu", "--mode", "ht", "--nodes", "2"]


def test_bench_reports_the_share_of_the_cap(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "uccl_ep.cli.main", "bench", *SMALL, "--iters", "4", "--json", str(out),
                           "--nic-model", "bw=2e8,lat_us=20,reorder=1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "of cap" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["op"], r["dtype"]) for r in rows] == [("dispatch", "bf16"), ("dispatch", "fp8"), ("combine", "bf16")]
    for r in rows:
        assert r["verified"] == "ok" and r["nic_cap_gbps"] == pytest.approx(0.2)
        assert r["nic_bytes"] > 0 and r["nic_gbps"] == pytest.approx(r["nic_bytes"] / 1e9 / r["time_s"])
        assert 0 < r["nic_of_cap"] <= 1.02, r       # the model never lets more through than its cap
        assert r["nic_wait_us"] >= 20, r             # a Write's post -> due: at least the model's latency
        # the link's idle time per back-to-back op: some (latency, host work), and busy + idle
        # within the op's time (one link per rank, counted once though four threads share it; the
        # counters are read just outside the timed calls, hence the margin)
        busy_us = r["nic_bytes"] / (r["nic_cap_gbps"] * 1e3)
        assert r["nic_idle_us"] > 0 and r["nic_idle_gaps"] >= 1, r
        assert r["nic_idle_us"] + busy_us <= r["time_s"] * 1e6 * 1.25, r
        by_length = sum(r[f"nic_idle_ge{us}us"] for us in (2, 5, 10, 20, 50, 100))
        assert abs(by_length - r["nic_idle_gaps"]) <= 1.0, r  # the open stretches at both ends aside


def test_bench_flag_rejects_a_bad_model(capsys):
    from uccl_ep.cli.bench import nic_model_from_args
    from uccl_ep.cli.main import main
    assert main(["bench", *SMALL, "--nic-model", "efa-400g,lat_us=-3"]) == 2   # before any rank starts
    assert "--nic-model (lat_us)" in capsys.readouterr().err
    assert nic_model_from_args(argparse.Namespace(nic_model="efa-400g")).cap_bytes_per_s == 50e9
    assert nic_model_from_args(argparse.Namespace(nic_model="")) is None


def _trace_worker(rank, world, model, rounds, transport):
    from uccl_ep.proxy import native, start_proxy
    C = native()
    p = start_proxy(dist.group.WORLD, region_bytes=1 << 16, num_counters=4, transport=transport, num_threads=1,
                    timeout_s=60.0, ranks_per_node=1, nic_model=model)
    try:
        dist.barrier()
        _ping_pong(p, C, rank, rounds, ping=1, pong=2)
        # read before the barrier: on a loaded machine the wait there lasts long enough for the proxies'
        # heartbeats to push the ping-pong's events out of the last `keep`
        trace = p.transport_trace()
        dist.barrier()
        return trace
    finally:
        p.stop()


def test_trace_keeps_the_last_events_of_each_endpoint():
    """`trace=n`: each endpoint keeps its last n events (posts with their link exit and due time,
    deliveries), oldest first, in one steady-clock time base."""
    rounds, keep = 12, 10
    traces = run_ranks(_trace_worker, 2, f"bw=1e9,lat_us=200,trace={keep}", rounds, "loop", timeout_s=120)
    # through the fault decorator too (outermost: fault:nic:<spec>:loop), which hands the model's trace on
    traces += run_ranks(_trace_worker, 2, f"bw=1e9,lat_us=200,trace={keep}", rounds, "fault:loop", timeout_s=120)
    for rank, rows in enumerate(traces):
        rank %= 2
        assert 0 < len(rows) <= keep, (rank, len(rows))
        assert all(len(r) == 8 and r[0] == 0 for r in rows)
        times = [r[2] for r in rows]
        assert times == sorted(times), "oldest first"
        posts = [r for r in rows if r[1] == 0]
        delivered = [r for r in rows if r[1] == 3]
        assert posts and delivered, rows
        for _, _, t, left, due, length, peer, imm in posts:  # a zero-byte message: latency only
            assert peer == 1 - rank and length == 0 and left >= t and due - left >= 200_000
        answer = 2 if rank == 0 else 1  # the counter the peer's atomics bump
        decoded = [(r, native().imm_decode(r[7])) for r in delivered]
        # a slow machine adds the proxies' heartbeats (control immediates)
        control = [(r, d) for r, d in decoded if d["kind"] == 3]
        assert all(r[6] == 1 - rank and d["op"] == 1 for r, d in control), control
        atomics = [(r, d) for r, d in decoded if d["kind"] != 3]
        assert atomics, rows
        assert all(r[6] == 1 - rank and d["kind"] == 2 and d["counter"] == answer for r, d in atomics), atomics
