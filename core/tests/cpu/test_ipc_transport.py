"""The `ipc` transport (core/csrc/transport/ipc.cc) on CPU, through its host-memory mode: the
sending proxy's copy engine (a memcpy worker here, cuMemcpyDtoDAsync on a GPU) copies into the
receiver's region, and only then is the immediate appended to the receiver's inbox.

Covered here with the real transport code: counted writes and count fences, ordered (HT) writes,
control messages and barriers, bounds checks on both sides, back-pressure, a rank that dies,
proxies in one process and in separate processes (with the fault decorator reordering, delaying
and tearing), and the host executor's LL and HT protocols over ipc against the reference.

NOT covered on CPU: the CUDA copy engine (device regions, CUDA IPC handles, per-peer streams and
events). That part is verified only on a GPU machine, by core/tests/gpu/test_cuda_ll_proxy.py
(run with `bash tools/lab/run_device.sh build proxy`).
"""

import hashlib
import threading
import time

import numpy as np
import pytest

from multirank import run_ranks
from test_host_executor import FAULT_ENV, LL_CASES, _check, _ht_worker, _ll_worker
from test_proxy import expect_refused_write, make_group, stop_all
from test_transport import _streams_worker
from uccl_ep.errors import Aborted, PeerFailure, PeerProtocolError, Unsupported
from uccl_ep.proxy import native

pytestmark = pytest.mark.cpu

C = native()
FAULT = "reorder=1,delay=24,tear=0.5,pieces=4,seed={seed}"


def test_backend_is_registered_and_available():
    assert "ipc" in C.transport_backends()
    assert C.transport_unavailable_reason("ipc") == ""


@pytest.mark.parametrize("transport", ["ipc", "fault:ipc"])
def test_counted_writes_land_before_their_fence(transport):
    ps = make_group(3, transport)  # fault: 100% reorder, delays, torn writes (test_proxy.FAULT)
    try:
        assert ps[0].transport_name.endswith("ipc:host")
        rng = np.random.default_rng(1)
        for r, p in enumerate(ps):
            p.region()[:65536] = rng.integers(0, 256, 65536, dtype=np.uint8)
        for src in range(3):
            for dst in range(3):
                for c in range(4):
                    n = 5 + c
                    for i in range(n):
                        off = 65536 + ((src * 3 + dst) * 4 + c) * 16 * 256 + i * 256
                        ps[src].push(c % ps[src].num_fifos,
                                     *C.encode_counted_write(dst, 1024 * i + 16 * c, off, 240, c), 5.0)
                    ps[src].push(c % ps[src].num_fifos, *C.encode_atomic(dst, c, n + 1, True), 5.0)
        for dst in range(3):
            region = ps[dst].region()
            for src in range(3):
                for c in range(4):
                    n = 5 + c
                    assert ps[dst].wait_counter(src, c, n + 1, 10.0, "test") == n + 1
                    for i in range(n):
                        off = 65536 + ((src * 3 + dst) * 4 + c) * 16 * 256 + i * 256
                        want = ps[src].region()[1024 * i + 16 * c:1024 * i + 16 * c + 240]
                        assert np.array_equal(region[off:off + 240], want), (src, dst, c, i)
        counters = ps[0].transport_counters()
        # the bytes moved through the ipc copy engine (not the receiver, as loop does); torn writes
        # (fault) are several copies each
        writes = 3 * (5 + 6 + 7 + 8)
        assert counters["ipc_host_copies"] >= writes
        assert counters["ipc_copy_bytes"] == 240 * writes
        # diagnostics: every write posted to a rank was delivered to it, with its post->delivery time
        # (heartbeats, zero-length messages, may still be on their way: posted >= delivered)
        delivered = sum(counters[f"ipc_delivered_to_{r}"] for r in range(3))
        assert sum(counters[f"ipc_posted_to_{r}"] for r in range(3)) >= delivered >= writes
        assert counters["ipc_post_to_deliver_ns"] > 0 and counters["ipc_submit_ns"] > 0
        # payload bytes per destination: data Writes only (heartbeats carry none)
        assert [counters[f"ipc_bytes_to_{r}"] for r in range(3)] == [240 * (5 + 6 + 7 + 8)] * 3
    finally:
        stop_all(ps)


def test_barrier_two_nodes_of_two_and_rail():
    ps = make_group(4, "ipc", ranks_per_node=2)
    try:
        for rail in (False, True, False):
            idx = [p.push(1, *C.encode_barrier(rail), 5.0) for p in ps]
            for p, i in zip(ps, idx):
                p.wait_completion(1, i, 10.0, "barrier")
    finally:
        stop_all(ps)


@pytest.mark.parametrize("transport", ["ipc", "nic:bw=1e9,lat_us=50,overlap=1:ipc", "nic:bw=1e9,lat_us=50,overlap=0:ipc",
                                       "nic:bw=1e9,lat_us=50,reorder=1,window_us=20:ipc"])
def test_sender_refuses_out_of_bounds_before_copying(transport):
    # with the proxy's own check off, the transport's check is what stops the copy; under the NIC
    # model with overlap the refusal of the Write's bytes becomes the Write's one completion
    ps = make_group(2, transport, check_remote_bounds=False, ranks_per_node=1)
    try:
        counters = expect_refused_write(ps)
        assert counters["ipc_host_copies"] == 0
        split = transport.startswith("nic:") and "overlap=0" not in transport  # overlap is the default
        assert counters.get("nic_model_split_writes", 0) == int(split), counters
    finally:
        stop_all(ps)


def test_proxy_check_names_the_peer():
    ps = make_group(2, "ipc")
    try:
        ps[0].push(0, *C.encode_counted_write(1, 0, 1 << 20, 16, 1), 5.0)
        deadline = time.monotonic() + 10
        while not ps[0].failed and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(PeerProtocolError, match="outside its region"):
            ps[0].raise_if_failed()
    finally:
        stop_all(ps)


def test_back_pressure_with_a_tiny_window():
    # max_inflight 1: every write waits for the previous one's delivery; nothing is lost
    ps = make_group(2, "ipc", max_inflight=1, fifo_capacity=8)
    try:
        for i in range(300):
            ps[0].push(0, *C.encode_counted_write(1, 0, 4096 + 16 * (i % 64), 16, 2), 5.0)
        ps[0].push(0, *C.encode_atomic(1, 2, 301, True), 5.0)
        assert ps[1].wait_counter(0, 2, 301, 20.0, "window") == 301
    finally:
        stop_all(ps)


def test_stop_releases_a_waiter():
    ps = make_group(2, "ipc")
    got = []

    def wait():
        try:
            ps[0].wait_counter(1, 0, 1, 20.0, "never")
        except (Aborted, PeerFailure) as e:
            got.append(type(e).__name__)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.2)
    stop_all(ps)
    t.join(timeout=10)
    assert not t.is_alive() and got, got


def test_host_region_must_be_shared_memory():
    # an external host buffer cannot be copied into by other processes' proxies
    buf = np.zeros(1 << 16, dtype=np.uint8)
    digest = hashlib.sha256(b"ipc-external").hexdigest()
    with pytest.raises(Unsupported, match="neither CUDA device memory nor host memory in named shared"):
        C.Proxy(dict(rank=0, num_ranks=1, num_threads=1, region_bytes=buf.size, external_region=buf.ctypes.data,
                     transport="ipc", token_digest=digest))


# --------------------------------------------------------------------------------------------------
# separate processes
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world,ranks_per_node", [(2, 2), (4, 2)])
def test_random_streams_every_byte_and_counter(world, ranks_per_node):
    results = run_ranks(_streams_worker, world, [("ipc", ""), ("ipc", FAULT)], 3, ranks_per_node, timeout_s=240)
    for per_rank in results:
        for transport, faulty, name, n, counters in per_rank:
            assert n > 200
            assert name == ("fault:ipc:host" if faulty else "ipc:host")
            assert counters["ipc_host_copies"] > 0
            if faulty:
                assert counters["fault_held_writes"] > 0 and counters["fault_torn_writes"] > 0, counters


def test_killed_rank_makes_survivors_raise_peer_failure():
    from test_transport import test_killed_rank_makes_survivors_raise_peer_failure as killed
    killed("ipc")


def test_host_executor_ll_over_ipc_matches_reference():
    _check(run_ranks(_ll_worker, 2, 0, 41, LL_CASES, timeout_s=300, env={"UCCL_EP_TRANSPORT": "ipc"}))


def test_host_executor_over_faulty_ipc_matches_reference():
    env = dict(FAULT_ENV, UCCL_EP_TRANSPORT="ipc")
    _check(run_ranks(_ll_worker, 2, 0, 43, LL_CASES[:5], timeout_s=300, env=env))
    _check(run_ranks(_ht_worker, 2, 0, 47, ["random", "fp8"], timeout_s=300, env=env))
