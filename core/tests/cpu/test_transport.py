"""Proxies in separate processes (2 and 4 ranks, and 2 nodes x 2 ranks), bootstrapped over the
torch.distributed store, over `loop` and `tcp;ofi_rxm` on 127.0.0.1, with and without `fault`
(100% reorder, delays, torn writes): randomized LL- and HT-pattern command streams with every
byte and counter checked; a rank killed mid-stream; a wrong job token."""

import datetime
import os
import queue
import time

import pytest
import torch.multiprocessing as mp

from multirank import free_port, run_ranks
from uccl_ep.proxy import transport_unavailable_reason

pytestmark = pytest.mark.cpu

HAVE_FABRIC = transport_unavailable_reason("fabric") is None
FAULT = "reorder=1,delay=24,tear=0.5,pieces=4,seed={seed}"


def _streams_worker(rank, world, cases, rounds, ranks_per_node):
    import torch.distributed as dist

    from uccl_ep import proxy
    from uccl_ep.proxy.streams import StreamSpec, region_bytes_for, run_streams
    out = []
    for i, (transport, fault) in enumerate(cases):
        spec = StreamSpec(seed=100 + i)
        p = proxy.start_proxy(dist.group.WORLD, region_bytes=region_bytes_for(spec, world),
                              num_counters=spec.num_counters, transport=transport, num_threads=2, timeout_s=60,
                              fault=fault.format(seed=rank + 17 * i) if fault else "", ranks_per_node=ranks_per_node)
        try:
            n = run_streams(rank, world, p, spec, rounds=rounds, timeout_s=60)
            out.append((transport, bool(fault), p.transport_name, n, p.transport_counters()))
        finally:
            p.stop()
    return out


def _cases():
    cases = [("loop", ""), ("loop", FAULT)]
    if HAVE_FABRIC:
        cases += [("fabric", ""), ("fabric", FAULT)]
    return cases


@pytest.mark.parametrize("world,ranks_per_node", [(2, 2), (4, 2)])
def test_random_streams_every_byte_and_counter(world, ranks_per_node):
    results = run_ranks(_streams_worker, world, _cases(), 4, ranks_per_node, timeout_s=240)
    for per_rank in results:
        for transport, faulty, name, n, counters in per_rank:
            assert n > 300
            assert name.startswith(("fault:" if faulty else "") + transport)
            if faulty:  # the faults really happened: writes held back and reordered, writes torn
                assert counters["fault_held_writes"] > 0 and counters["fault_torn_writes"] > 0, counters
                assert counters["fault_pieces"] >= 2 * counters["fault_torn_writes"], counters


@pytest.mark.slow
def test_random_streams_full_count():
    """>= 100,000 commands through every transport, with faults, on 4 ranks (2 nodes x 2)."""
    results = run_ranks(_streams_worker, 4, [c for c in _cases() if c[1]], 80, 2, timeout_s=1200)
    for i in range(len(results[0])):
        assert sum(r[i][3] for r in results) >= 100_000


# --------------------------------------------------------------------------------------------------
# a rank dies mid-stream
# --------------------------------------------------------------------------------------------------
def _threads():
    return len(os.listdir("/proc/self/task"))


def _victim_worker(rank, world, transport, results):
    import torch.distributed as dist

    from uccl_ep import proxy
    from uccl_ep.errors import PeerFailure
    from uccl_ep.proxy.streams import StreamSpec, region_bytes_for, run_streams
    spec = StreamSpec(seed=3)
    before = _threads()
    p = proxy.start_proxy(dist.group.WORLD, region_bytes=region_bytes_for(spec, world), num_counters=spec.num_counters,
                          transport=transport, num_threads=2, timeout_s=6.0)
    run_streams(rank, world, p, spec, rounds=1, timeout_s=6.0)
    if rank == 1:
        os._exit(3)  # dies without a word, mid-job
    C = proxy.native()
    # keep sending to everyone, and wait for what rank 1 would have sent next
    t0 = time.monotonic()
    try:
        for _ in range(20):
            for dst in range(world):
                p.push(0, *C.encode_atomic(dst, 0, 1, False), 6.0)
        p.wait_counter(1, 0, 10 ** 9, 6.0, "after the victim died")
        outcome = "no error"
    except PeerFailure as e:
        outcome = ("PeerFailure", e.peer, str(e))
    elapsed = time.monotonic() - t0
    p.stop()
    # NOTES: libfabric's tcp provider ends its progress thread asynchronously after the fabric
    # closes; on a loaded 2-core runner it was seen still alive right after stop(). A real leak
    # outlives the grace period.
    grace = time.monotonic() + 3.0
    while _threads() > before and time.monotonic() < grace:
        time.sleep(0.05)
    results.put((rank, outcome, elapsed, _threads() - before))


def _entry(rank, world, port, fn, args, results):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    fn(rank, world, *args, results)


@pytest.mark.parametrize("transport", ["loop"] + (["fabric"] if HAVE_FABRIC else []))
def test_killed_rank_makes_survivors_raise_peer_failure(transport):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    world, port = 3, free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, _victim_worker, (transport,), results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    try:
        deadline = time.monotonic() + 120
        while len(got) < world - 1 and time.monotonic() < deadline:
            try:
                rank, outcome, elapsed, leaked = results.get(timeout=1.0)
                got[rank] = (outcome, elapsed, leaked)
            except queue.Empty:
                if procs[0].exitcode not in (None, 0) or procs[2].exitcode not in (None, 0):
                    break
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert procs[1].exitcode == 3
    assert sorted(got) == [0, 2], f"survivors did not report: {got}"
    for rank, (outcome, elapsed, leaked) in got.items():
        assert outcome[:2] == ("PeerFailure", 1), (rank, outcome)
        assert elapsed < 6.0, f"rank {rank} took {elapsed:.1f}s (timeout 6s)"
        assert leaked == 0, f"rank {rank} leaked {leaked} threads"


# --------------------------------------------------------------------------------------------------
# a rank of another job
# --------------------------------------------------------------------------------------------------
def _token_worker(rank, world):
    import torch.distributed as dist

    from uccl_ep import proxy
    from uccl_ep.errors import PeerFailure, PeerProtocolError
    try:
        p = proxy.start_proxy(dist.group.WORLD, region_bytes=1 << 16, num_counters=4, transport="loop",
                              token="intruder" if rank == 1 else "the-job", timeout_s=20)
        p.stop()
        return "connected"
    except PeerProtocolError as e:
        return ("PeerProtocolError", str(e))
    except PeerFailure as e:
        return ("PeerFailure", str(e))


def _store_worker(rank, world):
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from uccl_ep import proxy
    store = dist.PrefixStore("an-explicit-store", c10d._get_default_store())
    p = proxy.start_proxy(dist.group.WORLD, region_bytes=1 << 16, num_counters=4, transport="loop", store=store,
                          timeout_s=20)
    C = proxy.native()
    try:
        p.push(0, *C.encode_atomic(1 - rank, 3, 5, False), 5.0)
        return int(p.wait_counter(1 - rank, 3, 5, 10.0, "explicit store")), store.check(["uccl_ep/proxy/0/ep/0"])
    finally:
        p.stop()


def test_bootstrap_over_an_explicit_store():
    assert run_ranks(_store_worker, 2, timeout_s=120) == [(5, True), (5, True)]


def _secret_worker(rank, world):
    """Round 1: both ranks hold the secret and connect. Round 2: rank 1 does not hold it but reads
    rank 0's endpoint record from the store and presents its token digest as its own (what any
    store client can do): the proofs expose it."""
    import re

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from uccl_ep import proxy
    from uccl_ep.errors import PeerProtocolError
    from uccl_ep.proxy import bootstrap
    C = proxy.native()
    p = proxy.start_proxy(dist.group.WORLD, region_bytes=1 << 16, num_counters=4, transport="loop", token="s3cret",
                          timeout_s=20)
    try:
        p.push(0, *C.encode_atomic(1 - rank, 2, 7, False), 5.0)
        first = int(p.wait_counter(1 - rank, 2, 7, 10.0, "with the secret"))
    finally:
        p.stop()
    if rank == 1:
        store = c10d._get_default_store()

        def stolen(_token):
            store.wait(["uccl_ep/proxy/1/ep/0"])
            return re.search(rb"[0-9a-f]{64}", store.get("uccl_ep/proxy/1/ep/0")).group().decode()
        bootstrap.token_digest = stolen
    try:
        p = proxy.start_proxy(dist.group.WORLD, region_bytes=1 << 16, num_counters=4, transport="loop",
                              token="s3cret" if rank == 0 else "a-guess", timeout_s=20)
        p.stop()
        return first, "connected"
    except PeerProtocolError as e:
        return first, (e.peer, str(e))


def test_job_secret_is_proven_not_presented():
    (f0, r0), (f1, r1) = run_ranks(_secret_worker, 2, timeout_s=120)
    assert f0 == f1 == 7
    assert r0 != "connected" and r0[0] == 1 and "proof" in r0[1] and "rank 1 presented" in r0[1], r0
    assert r1 != "connected" and r1[0] == 0 and "proof" in r1[1], r1


def test_wrong_job_token_is_refused():
    out = run_ranks(_token_worker, 3, timeout_s=120)
    for rank, (kind, msg) in enumerate(out):
        assert kind == "PeerProtocolError", (rank, kind, msg)
        assert "different job token" in msg
        # ranks of the job blame the intruder; the intruder blames the first rank it checked
        assert ("rank 1 presented" in msg) if rank != 1 else ("rank 0 presented" in msg)


def _domains_worker(rank, world):
    import torch.distributed as dist

    from uccl_ep import proxy
    from uccl_ep.proxy.streams import StreamSpec, region_bytes_for, run_streams
    spec = StreamSpec(seed=7)
    p = proxy.start_proxy(dist.group.WORLD, region_bytes=region_bytes_for(spec, world), num_counters=spec.num_counters,
                          transport="fabric", num_threads=3, timeout_s=60)
    try:
        return run_streams(rank, world, p, spec, rounds=2, timeout_s=60), list(p.transport_devices)
    finally:
        p.stop()


@pytest.mark.skipif(not HAVE_FABRIC, reason="libfabric with tcp;ofi_rxm is not installed")
def test_fabric_threads_spread_over_the_listed_nics():
    """UCCL_EP_FABRIC_DOMAINS: proxy thread i opens its endpoint on NIC i % n (here the loopback and,
    when the machine has one, another addressed interface), and every byte of the random command
    streams still arrives."""
    from uccl_ep.proxy import fabric_domains
    found = fabric_domains("tcp;ofi_rxm")   # tcp's domains are the interfaces that have an address
    assert "lo" in found, found
    other = next((name for name in found if name != "lo"), None)
    nics = ["lo", other] if other else ["lo"]
    env = {"UCCL_EP_FABRIC_DOMAINS": ",".join(nics), "UCCL_EP_FABRIC_PROVIDER": "tcp;ofi_rxm"}
    for n, devices in run_ranks(_domains_worker, 2, timeout_s=180, env=env):
        assert n > 100
        assert devices == [nics[t % len(nics)] for t in range(3)], devices


def _bad_domain_worker(rank, world):
    import torch.distributed as dist

    from uccl_ep import proxy
    from uccl_ep.errors import Unsupported
    try:
        proxy.start_proxy(dist.group.WORLD, region_bytes=1 << 20, num_counters=8, transport="fabric", num_threads=1,
                          timeout_s=20)
    except Unsupported as e:
        return str(e)
    return "started"


@pytest.mark.skipif(not HAVE_FABRIC, reason="libfabric with tcp;ofi_rxm is not installed")
def test_fabric_unknown_nic_is_a_clear_error():
    env = {"UCCL_EP_FABRIC_DOMAINS": "nope0", "UCCL_EP_FABRIC_PROVIDER": "tcp;ofi_rxm"}
    for msg in run_ranks(_bad_domain_worker, 1, timeout_s=60, env=env):
        assert "no domain 'nope0'" in msg and "'lo'" in msg, msg


def test_fabric_nics_per_local_rank():
    """`;` separates per-local-rank NIC lists (local rank L takes list L mod n); bad lists are refused."""
    from uccl_ep.errors import InvalidArgument
    from uccl_ep.proxy.bootstrap import domains_for_local_rank
    spec = "a0,a1; b0,b1 ;c0"
    assert [domains_for_local_rank(spec, r) for r in range(4)] == ["a0,a1", "b0,b1", "c0", "a0,a1"]
    assert domains_for_local_rank("x,y", 5) == "x,y" and domains_for_local_rank("", 3) == ""
    with pytest.raises(InvalidArgument, match="UCCL_EP_FABRIC_DOMAINS"):
        domains_for_local_rank("a;;b", 0)


@pytest.mark.skipif(not HAVE_FABRIC, reason="libfabric with tcp;ofi_rxm is not installed")
def test_fabric_local_ranks_on_different_nics():
    """Two local ranks, each on its own NIC list (`lo` for rank 0, the other interface for rank 1):
    thread i of one rank reaches thread i of the other across interfaces, every byte checked."""
    from uccl_ep.proxy import fabric_domains
    found = fabric_domains("tcp;ofi_rxm")
    other = next((name for name in found if name != "lo"), None)
    if other is None:
        pytest.skip("needs a second addressed interface besides lo")
    env = {"UCCL_EP_FABRIC_DOMAINS": f"lo;{other}", "UCCL_EP_FABRIC_PROVIDER": "tcp;ofi_rxm"}
    out = run_ranks(_domains_worker, 2, timeout_s=180, env=env)
    assert [devices for _, devices in out] == [["lo"] * 3, [other] * 3]
    assert all(n > 100 for n, _ in out)


class _RacingStore:
    """A Store where rank 1 publishes its value, then its failure, between a reader's two checks."""

    def __init__(self):
        self.keys = {"p/ep/0": b"a"}
        self.value_checks = 0

    def check(self, keys):
        (key,) = keys
        if key == "p/ep/1":
            self.value_checks += 1
            if self.value_checks == 1:  # first look: not there yet; then the peer publishes and fails
                self.keys["p/ep/1"] = b"b"
                self.keys["p/error/1"] = b"PeerProtocolError: a later phase"
                return False
        return key in self.keys

    def get(self, key):
        return self.keys[key]


def test_a_value_published_before_a_peer_failed_still_counts():
    """_wait_all returns the values a peer published even when that peer failed right after (the
    failure belongs to a later phase, which names it); a peer that failed without publishing raises."""
    import time

    from uccl_ep.errors import PeerFailure
    from uccl_ep.proxy.bootstrap import _wait_all
    now = time.monotonic()
    assert _wait_all(_RacingStore(), "p", "ep", 0, 2, now + 5, now, "endpoints") == [b"a", b"b"]
    store = _RacingStore()
    store.value_checks = 1
    store.keys["p/error/1"] = b"RuntimeError: setup"
    with pytest.raises(PeerFailure, match="peer 1 failed during 'endpoints'"):
        _wait_all(store, "p", "ep", 0, 2, now + 5, now, "endpoints")
