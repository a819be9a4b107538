"""The proxy in one process: receiver semantics driven directly, and whole proxies (several ranks
in one process over `loop`, `fabric` and `fault:`) for commands, quiet, barrier, errors, shutdown
and protocol limits."""

import hashlib
import os
import random
import threading
import time

import numpy as np
import pytest

from uccl_ep.errors import Aborted, InvalidArgument, LimitExceeded, PeerProtocolError, Unsupported
from uccl_ep.proxy import check_protocol_limits, native, transport_unavailable_reason

pytestmark = pytest.mark.cpu

C = native()
TRANSPORTS = ["loop", "fault:loop"] + ([] if transport_unavailable_reason("fabric") else ["fabric", "fault:fabric"])
FAULT = dict(fault_seed=11, fault_reorder=1.0, fault_max_delay=16, fault_tear=0.5)


def make_group(world, transport="loop", **kw):
    """`world` proxies of one job in this process, connected and started."""
    digest = hashlib.sha256(f"test-{random.random()}".encode()).hexdigest()
    cfg = dict(num_ranks=world, num_threads=2, fifos_per_thread=2, num_counters=32, region_bytes=1 << 20,
               transport=transport, token_digest=digest, timeout_s=10.0)
    if transport.startswith("fault:"):
        cfg.update(FAULT)
    cfg.update(kw)
    proxies = [C.Proxy(dict(cfg, rank=r)) for r in range(world)]
    infos = [p.local_info() for p in proxies]
    for p in proxies:
        p.connect(infos)
    for p in proxies:
        p.finalize_setup()
        p.start()
    return proxies


def stop_all(proxies):
    for p in proxies:
        p.stop()


def expect_refused_write(ps) -> dict:
    """Rank 0 writes 64 bytes across the end of rank 1's region (a group made with the proxy's own
    check off, so the transport refuses it): rank 0's proxy fails naming the refusal and rank 1's
    region is untouched. Returns rank 0's transport counters."""
    before = ps[1].region()[-64:].copy()
    ps[0].push(0, *C.encode_counted_write(1, 0, (1 << 20) - 32, 64, 1), 5.0)
    deadline = time.monotonic() + 10
    while not ps[0].failed and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(PeerProtocolError, match="refused"):
        ps[0].raise_if_failed()
    assert np.array_equal(ps[1].region()[-64:], before)  # nothing was copied
    return dict(ps[0].transport_counters())


# --------------------------------------------------------------------------------------------------
# receiver semantics, driven imm by imm
# --------------------------------------------------------------------------------------------------
def test_ordered_writes_apply_only_in_sequence_order():
    rng = random.Random(3)
    for trial in range(50):
        r = C.Receiver(2, 4)
        n = rng.randrange(1, 60)
        incs = [rng.randrange(0, 512) for _ in range(n)]
        order = list(range(n))
        rng.shuffle(order)
        seen = set()
        for s in order:
            assert r.on_imm(1, C.imm_ordered(3, s, incs[s])) == ""
            seen.add(s)
            prefix = 0
            while prefix in seen:
                prefix += 1
            # the counter is exactly the in-order prefix: never ahead of a missing write
            assert r.counters()[1 * 4 + 3] == sum(incs[:prefix])
        assert r.counters()[4 + 3] == sum(incs)


def test_ordered_sequence_wraps_and_rejects_duplicates_and_stale():
    r = C.Receiver(1, 2)
    for s in range(5000):  # wraps the 2048 sequence space twice
        assert r.on_imm(0, C.imm_ordered(1, s % 2048, 1)) == ""
    assert r.counters()[1] == 5000
    assert "expecting" in r.on_imm(0, C.imm_ordered(1, (5000 - 1) % 2048, 1))     # stale
    assert r.on_imm(0, C.imm_ordered(1, (5000 + 3) % 2048, 1)) == ""             # early, held
    assert "duplicate" in r.on_imm(0, C.imm_ordered(1, (5000 + 3) % 2048, 1))
    assert "in flight" in r.on_imm(0, C.imm_ordered(1, (5000 + 1500) % 2048, 1))  # beyond the window


def test_fenced_atomic_waits_for_its_writes():
    r = C.Receiver(3, 8)
    assert r.on_imm(2, C.imm_atomic(5, 4, True)) == ""       # 3 writes announced before they land
    for _ in range(2):
        r.on_imm(2, C.imm_counted(5))
        assert r.counters()[2 * 8 + 5] == 0
    r.on_imm(2, C.imm_counted(5))
    assert r.counters()[2 * 8 + 5] == 4
    # writes of the next round arriving first are kept for the next fence
    r.on_imm(2, C.imm_counted(5))
    r.on_imm(2, C.imm_atomic(5, 2, True))
    assert r.counters()[2 * 8 + 5] == 6
    r.on_imm(2, C.imm_atomic(5, 1, True))                       # zero writes: signal at once
    assert r.counters()[2 * 8 + 5] == 7
    # unfenced atomics add at once, negative values too; other sources are independent
    r.on_imm(0, C.imm_atomic(5, -9, False))
    assert r.counters()[5] == -9 and r.counters()[2 * 8 + 5] == 7


def test_signal_pair_counts_any_number_of_writes_in_any_order():
    """The LL proxy path's per-(op, peer) signal (device/proxy_ll.cuh push_op_signal): n counted
    writes, a fenced Atomic n + 1 and a plain Atomic total - n - 1. Whatever n and the arrival
    order, the counter reaches the op's target exactly when every message of the op arrived."""
    rng = random.Random(7)
    total = 18  # ProxyLayout.signal_total: above the most writes an op sends a peer, plus 1
    r = C.Receiver(2, 4)
    for op in range(200):
        n = rng.choice([0, 1, 1, 2, 5, total - 2])
        msgs = [C.imm_counted(3)] * n + [C.imm_atomic(3, n + 1, True)]
        if total - n - 1 > 0:
            msgs.append(C.imm_atomic(3, total - n - 1, False))
        rng.shuffle(msgs)
        target = total * (op + 1)
        for i, m in enumerate(msgs):
            assert r.on_imm(1, m) == ""
            got = r.counters()[1 * 4 + 3]
            assert (got >= target) == (i == len(msgs) - 1), (op, n, i, got, target)
        assert r.counters()[1 * 4 + 3] == target


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_packed_region_writes_and_signal_pair_through_proxies(transport):
    """What the packed LL kernels push per (op, peer) -- a region cut into chunk-sized counted
    Writes, then the signal pair, all on one FIFO -- through whole proxies (fault: reorders, delays,
    tears): the counter reaches k * total only once op k's bytes all landed."""
    ps = make_group(2, transport)
    total, chunk = 10, 4096
    try:
        rng = np.random.default_rng(9)
        for op in range(6):
            sizes = [int(rng.integers(0, 8 * chunk)) // 16 * 16 for _ in ps]
            for r, p in enumerate(ps):
                p.region()[:sizes[r]] = rng.integers(0, 256, sizes[r], dtype=np.uint8)
            srcs = [p.region()[:sizes[r]].copy() for r, p in enumerate(ps)]
            for r, p in enumerate(ps):
                dst, base = 1 - r, 65536 + r * 65536
                n = 0
                for at in range(0, sizes[r], chunk):
                    p.push(dst, *C.encode_counted_write(dst, at, base + at, min(chunk, sizes[r] - at), 5), 5.0)
                    n += 1
                p.push(dst, *C.encode_atomic(dst, 5, n + 1, True), 5.0)
                p.push(dst, *C.encode_atomic(dst, 5, total - n - 1, False), 5.0)
            for r, p in enumerate(ps):
                src = 1 - r
                assert p.wait_counter(src, 5, total * (op + 1), 10.0, "test") == total * (op + 1)
                got = p.region()[65536 + src * 65536:65536 + src * 65536 + sizes[src]]
                assert np.array_equal(got, srcs[src]), (op, r)
    finally:
        stop_all(ps)


def _region_parts(length, parts_wanted, threads, min_part=256 << 10):
    """Offsets and lengths of the parts of one region, as device/proxy_ll.cuh push_region cuts it
    (Tuning.ll_proxy_parts): at most one part per proxy thread and per min_part bytes, 16-byte
    aligned parts, the last one taking the rest."""
    parts = min(parts_wanted, threads)
    if parts > length // min_part:
        parts = max(1, length // min_part)
    per = (-(-length // parts) + 15) // 16 * 16
    return [(k * per, (length - k * per) if k == parts - 1 else per) for k in range(parts)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_region_parts_over_proxy_threads_and_their_signals(transport):
    """Tuning.ll_proxy_parts: a region spread over FIFOs of distinct proxy threads, each part's
    counted Writes closed by its own fenced Atomic (writes + 1) and the last part padding the
    counter's growth to signal_total, through whole proxies (fault: reorders, delays, tears): the
    counter reaches k * total only once every part of op k landed, whatever the parts' order."""
    threads, fifos_per_thread = 2, 2
    ps = make_group(2, transport, num_threads=threads, fifos_per_thread=fifos_per_thread, region_bytes=4 << 20)
    num_fifos, chunk, min_part, parts_wanted = threads * fifos_per_thread, 96 << 10, 64 << 10, 4
    # ProxyLayout.signal_total for P parts: above the most Writes (chunks of the largest region, plus
    # one per extra part) and a fenced Atomic per part
    total = -(-(1 << 20) // chunk) + 2 * parts_wanted
    try:
        rng = np.random.default_rng(13)
        for op in range(6):
            sizes = [int(rng.integers(0, 1 << 20)) // 16 * 16 for _ in ps]
            for r, p in enumerate(ps):
                p.region()[:sizes[r]] = rng.integers(0, 256, sizes[r], dtype=np.uint8)
            srcs = [p.region()[:sizes[r]].copy() for r, p in enumerate(ps)]
            for r, p in enumerate(ps):
                dst, base = 1 - r, (1 << 20) + r * (1 << 20)
                parts = _region_parts(sizes[r], parts_wanted, threads, min_part)
                assert len({(dst + k) % num_fifos % threads for k in range(len(parts))}) == len(parts)
                added = 0
                for k, (at0, n) in enumerate(parts):
                    fifo, writes = (dst + k) % num_fifos, 0
                    for at in range(at0, at0 + n, chunk):
                        p.push(fifo, *C.encode_counted_write(dst, at, base + at, min(chunk, at0 + n - at), 5), 5.0)
                        writes += 1
                    if writes == 0:  # a zero-length region still closes with one Write (min_writes)
                        p.push(fifo, *C.encode_counted_write(dst, at0, base + at0, 0, 5), 5.0)
                        writes = 1
                    p.push(fifo, *C.encode_atomic(dst, 5, writes + 1, True), 5.0)
                    added += writes + 1
                assert added < total
                p.push((dst + len(parts) - 1) % num_fifos, *C.encode_atomic(dst, 5, total - added, False), 5.0)
            for r, p in enumerate(ps):
                src = 1 - r
                assert p.wait_counter(src, 5, total * (op + 1), 10.0, "test") == total * (op + 1)
                got = p.region()[(1 << 20) + src * (1 << 20):(1 << 20) + src * (1 << 20) + sizes[src]]
                assert np.array_equal(got, srcs[src]), (op, r)
    finally:
        stop_all(ps)


@pytest.mark.parametrize("imm,src,msg", [
    (lambda: C.imm_counted(8), 0, "out of range"),
    (lambda: C.imm_counted(1) | (1 << 20), 0, "malformed"),
    (lambda: C.imm_atomic(1, 0, True), 0, "count + 1"),
    (lambda: C.imm_counted(1), 5, "unknown rank"),
])
def test_receiver_rejects_protocol_violations(imm, src, msg):
    assert msg in C.Receiver(2, 8).on_imm(src, imm())


# --------------------------------------------------------------------------------------------------
# proxies
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_counted_writes_and_fence_between_two_ranks(transport):
    ps = make_group(2, transport)
    try:
        rng = np.random.default_rng(5)
        for r, p in enumerate(ps):
            p.region()[:65536] = rng.integers(0, 256, 65536, dtype=np.uint8)
        srcs = [p.region()[:65536].copy() for p in ps]
        for r, p in enumerate(ps):
            dst = 1 - r
            for i in range(40):
                p.push(i % 4, *C.encode_counted_write(dst, i * 1024, 65536 + r * 65536 + i * 1008, 1000, 7 + i % 4),
                       5.0)
            for c in range(4):
                p.push(c, *C.encode_atomic(dst, 7 + c, 11, True), 5.0)
        for r, p in enumerate(ps):
            src = 1 - r
            for c in range(4):
                assert p.wait_counter(src, 7 + c, 11, 10.0, "test") == 11
            got = p.region()[65536 + src * 65536:65536 + src * 65536 + 40 * 1008]
            exp = np.concatenate([np.pad(srcs[src][i * 1024:i * 1024 + 1000], (0, 8)) for i in range(40)])
            assert np.array_equal(got, exp)
        assert all(p.commands_posted == 44 for p in ps)
    finally:
        stop_all(ps)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_barrier_two_nodes_of_two_and_rail(transport):
    ps = make_group(4, transport, ranks_per_node=2)
    try:
        for rail in (False, True, False, True):
            idx = [p.push(0, *C.encode_barrier(rail), 5.0) for p in ps[:3]]
            time.sleep(0.05)
            # Rank 3 has not arrived. All ranks: nobody passes. Rail scope (rails {0, 2} and
            # {1, 3}): ranks 0 and 2 pass, rank 1 waits for rank 3.
            assert [ps[i].check_completion(0, idx[i]) for i in range(3)] == ([True, False, True] if rail else [False] * 3)
            ps[3].wait_completion(0, ps[3].push(0, *C.encode_barrier(rail), 5.0), 5.0, "barrier")
            for i in range(3):
                ps[i].wait_completion(0, idx[i], 5.0, "barrier")
    finally:
        stop_all(ps)


def test_quiet_scopes():
    (p,) = make_group(1, "fault:loop", num_threads=1, fifos_per_thread=3)
    try:
        for f in range(3):
            for i in range(50):
                p.push(f, *C.encode_counted_write(0, 0, 4096 + f * 65536 + i * 64, 64, f), 5.0)
        q = p.push(0, *C.encode_quiet(True), 5.0)
        p.wait_completion(0, q, 5.0, "quiet")
        # a whole-thread quiet completes only after every FIFO's earlier commands did
        assert p.check_completion(1, 49) and p.check_completion(2, 49)
        q0 = p.push(1, *C.encode_quiet(False), 5.0)
        p.wait_completion(1, q0, 5.0, "fifo quiet")
    finally:
        p.stop()


def test_external_region_is_registered_in_place():
    transport = "fault:fabric" if "fabric" in TRANSPORTS else None
    if transport is None:
        pytest.skip("libfabric is not installed")
    mem = [np.zeros(1 << 16, dtype=np.uint8) for _ in range(2)]
    digest = hashlib.sha256(b"external").hexdigest()
    ps = [C.Proxy(dict(rank=r, num_ranks=2, num_threads=1, num_counters=4, region_bytes=mem[r].nbytes,
                       external_region=mem[r].ctypes.data, transport=transport, token_digest=digest, timeout_s=10.0,
                       **FAULT)) for r in range(2)]
    try:
        infos = [p.local_info() for p in ps]
        for p in ps:
            p.connect(infos)
            p.finalize_setup()
            p.start()
        mem[0][:4096] = np.arange(4096) % 251
        ps[0].push(0, *C.encode_counted_write(1, 0, 8192, 4096, 2), 5.0)
        ps[0].push(0, *C.encode_atomic(1, 2, 2, True), 5.0)
        assert ps[1].wait_counter(0, 2, 2, 10.0, "external") == 2
        assert np.array_equal(mem[1][8192:8192 + 4096], np.arange(4096) % 251)
        assert np.shares_memory(ps[1].region(), mem[1])
    finally:
        stop_all(ps)
    with pytest.raises(InvalidArgument, match="shared memory"):
        C.Proxy(dict(region_bytes=mem[0].nbytes, external_region=mem[0].ctypes.data, transport="loop",
                     token_digest=digest))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bad_commands_fail_the_proxy_with_protocol_errors(transport):
    ps = make_group(2, transport)
    try:
        # write beyond the peer's region: refused before posting, names the peer
        ps[0].push(0, *C.encode_counted_write(1, 0, (1 << 20) - 16, 64, 0), 5.0)
        with pytest.raises(PeerProtocolError, match="outside its region"):
            ps[0].wait_counter(1, 0, 1, 5.0, "oob")
        with pytest.raises(PeerProtocolError):
            ps[0].push(1, *C.encode_atomic(1, 0, 1, False), 5.0)
        # an invalid command type
        ps[1].push(0, 0, 0, 5.0)
        with pytest.raises(PeerProtocolError, match="invalid command type"):
            ps[1].wait_counter(0, 0, 1, 5.0, "bad type")
    finally:
        stop_all(ps)


RECEIVER_CHECKED = [("loop", 2), ("fault:loop", 2), ("ipc", 2), ("fault:ipc", 2)] + (
    [] if transport_unavailable_reason("fabric") else
    [("fabric", 2), ("fault:fabric", 2), ("ipc+fabric", 1), ("ipc+fabric", 2)])


@pytest.mark.parametrize("transport,ranks_per_node", RECEIVER_CHECKED)
def test_receiver_names_the_writer_of_an_out_of_bounds_write(transport, ranks_per_node):
    """With the proxy's own (sender-side) check off, every transport refuses a write outside the
    receiver's region as a whole, and the receiver raises PeerProtocolError naming the writer at
    once (fabric used to drop it in the provider: a plain Timeout after the full wait)."""
    ps = make_group(2, transport, check_remote_bounds=False, ranks_per_node=ranks_per_node, timeout_s=20.0)
    try:
        before = ps[1].region().copy()
        ps[0].push(0, *C.encode_counted_write(1, 0, 4096, 64, 1), 5.0)      # lands
        ps[0].push(0, *C.encode_counted_write(1, 0, (1 << 20) - 16, 64, 0), 5.0)  # 48 bytes past the end
        t0 = time.monotonic()
        with pytest.raises(PeerProtocolError, match="outside this rank's region") as e:
            ps[1].wait_counter(0, 0, 1, 15.0, "oob at target")
        assert e.value.peer == 0 and e.value.rank == 1
        assert time.monotonic() - t0 < 5.0
        with pytest.raises(PeerProtocolError, match="refused"):
            ps[0].wait_counter(1, 0, 1, 15.0, "oob at sender")
        after = ps[1].region()
        assert np.array_equal(after[(1 << 20) - 4096:], before[(1 << 20) - 4096:])  # not a byte past 1 MiB - 4 KiB
    finally:
        stop_all(ps)


def _threads():
    return len(os.listdir("/proc/self/task"))


def test_stop_releases_waiters_and_joins_threads():
    before = _threads()
    ps = make_group(2)
    assert _threads() >= before + 4
    errors = []

    def waiter():
        try:
            ps[0].wait_counter(1, 3, 1, 60.0, "never")
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    ps[0].stop()
    t.join(5.0)
    assert not t.is_alive() and time.monotonic() - t0 < 3.0
    assert isinstance(errors[0], Aborted)
    with pytest.raises(Aborted):
        ps[0].push(0, *C.encode_quiet(False), 1.0)
    ps[1].stop()
    assert _threads() == before


def test_config_errors_are_typed():
    digest = "0" * 64
    with pytest.raises(InvalidArgument, match="num_counters"):
        C.Proxy(dict(num_counters=0, token_digest=digest))
    with pytest.raises(InvalidArgument, match="rank"):
        C.Proxy(dict(rank=2, num_ranks=2, token_digest=digest))
    with pytest.raises(InvalidArgument, match="unknown proxy option"):
        C.Proxy(dict(nonsense=1, token_digest=digest))
    with pytest.raises(Unsupported, match="unknown transport"):
        C.Proxy(dict(transport="carrier-pigeon", token_digest=digest))


def test_check_protocol_limits_says_which_limit_and_by_how_much():
    check_protocol_limits(256, num_experts=256 * 32, num_max_tokens=1024, hidden=7168, num_rdma_bytes=1 << 30,
                          num_channels=24, chunk_tokens=6, ring_tokens=256)
    with pytest.raises(LimitExceeded, match=r"num_ranks.*4096.*over by 1"):
        check_protocol_limits(4097)
    with pytest.raises(LimitExceeded, match=r"num_experts.*2048.*over by 2"):
        check_protocol_limits(2, num_experts=2 * 2050)
    with pytest.raises(LimitExceeded, match="num_max_dispatch_tokens_per_rank"):
        check_protocol_limits(2, num_max_tokens=40000)
    with pytest.raises(LimitExceeded, match="num_rdma_bytes"):
        check_protocol_limits(2, num_rdma_bytes=64 << 30)
    with pytest.raises(LimitExceeded, match="ring_tokens"):
        check_protocol_limits(2, ring_tokens=2048)
    with pytest.raises(LimitExceeded, match="chunk_tokens"):
        check_protocol_limits(2, chunk_tokens=600)


# --------------------------------------------------------------------------------------------------
# the bindings check their arguments (each of these crashed, read out of bounds or truncated)
# --------------------------------------------------------------------------------------------------
def test_proxy_indices_are_checked():
    ps = make_group(2)
    try:
        for src, c in ((10**6, 0), (0, 10**9), (-5, 0), (0, -1), (2, 0), (0, 32)):
            with pytest.raises(InvalidArgument, match="src|counter"):
                ps[0].counter(src, c)
        for peer in (10**9, -1, 2):
            with pytest.raises(InvalidArgument, match="peer"):
                ps[0].peer_dead(peer)
        with pytest.raises(InvalidArgument, match="timeout_s"):
            ps[0].wait_counter(1, 0, 1, float("nan"), "nan")
        with pytest.raises(InvalidArgument, match="index"):  # never pushed: would wait for itself
            ps[0].wait_completion(0, 10**6, 5.0, "never pushed")
        with pytest.raises(InvalidArgument, match="connect"):
            ps[0].connect([ps[0].local_info(), ps[1].local_info()])
        assert ps[0].counter(1, 31) == 0 and not ps[0].peer_dead(1)
    finally:
        stop_all(ps)


def test_encoders_refuse_values_that_do_not_fit_their_field():
    with pytest.raises(LimitExceeded, match="24-bit len") as e:
        C.encode_counted_write(1, 0, 0, (1 << 24) + 64, 0)
    assert e.value.limit == (1 << 24) - 1 and e.value.needed == (1 << 24) + 64
    with pytest.raises(LimitExceeded, match="12-bit dst_rank"):
        C.encode_counted_write(4097, 0, 0, 16, 0)
    with pytest.raises(LimitExceeded, match="31-bit"):
        C.encode_counted_write(1, 1 << 40, 0, 16, 0)
    with pytest.raises(LimitExceeded, match="13-bit counter"):
        C.encode_atomic(1, 8192, 1, False)
    with pytest.raises(LimitExceeded, match="16-bit"):
        C.encode_atomic(1, 0, 1 << 15, False)
    with pytest.raises(InvalidArgument, match="value"):
        C.encode_atomic(1, 0, -(1 << 15) - 1, False)
    with pytest.raises(LimitExceeded, match="10-bit counter"):
        C.encode_ordered_write(1, 0, 0, 16, 1024, 1)
    with pytest.raises(LimitExceeded, match="9-bit increment"):
        C.encode_ordered_write(1, 0, 0, 16, 0, 512)
    with pytest.raises(InvalidArgument, match="dst"):
        C.encode_counted_write(-1, 0, 0, 16, 0)
    with pytest.raises(InvalidArgument, match="len"):
        C.encode_counted_write(1, 0, 0, "16", 0)
    with pytest.raises(InvalidArgument, match="counter"):
        C.imm_counted(1.0)


def test_push_counted_checks_every_value():
    ps = make_group(2)
    try:
        i32 = lambda *v: np.array(v, dtype=np.int32)  # noqa: E731
        i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
        none = (i32(), i32(), i32(), np.array([], dtype=np.uint8))
        for kw, match in ((dict(src_off=i64(1 << 40)), "src_off"), (dict(dst=i32(2)), "dst"),
                          (dict(counter=i32(32)), "counter"), (dict(dst_off=i64(8)), "multiples of 16"),
                          (dict(src_off=i64(1 << 20)), "src_off")):
            args = dict(dst=i32(1), src_off=i64(0), dst_off=i64(0), counter=i32(0))
            args.update(kw)
            with pytest.raises(InvalidArgument, match=match):
                C.push_counted(ps[0], args["dst"], args["src_off"], args["dst_off"], args["counter"], 64, *none, 1, 5.0)
        with pytest.raises(InvalidArgument, match="dst"):
            C.push_counted(ps[0], np.array([1], dtype=np.int64), i64(0), i64(0), i32(0), 64, *none, 1, 5.0)
        assert ps[0].commands_posted == 0  # nothing half-pushed
    finally:
        stop_all(ps)


def test_shm_capacity_counts_every_region(tmp_path):
    """Two regions that each fit /dev/shm but not together: the second is refused at creation
    (it used to be created and SIGBUS when written). Runs in a private mount namespace with a
    64 MiB /dev/shm."""
    import shutil
    import subprocess
    import sys
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to mount a small private /dev/shm")
    script = tmp_path / "two_regions.py"
    script.write_text(
        "from uccl_ep.proxy import native\nfrom uccl_ep.errors import Unsupported\nC = native()\n"
        "cfg = dict(num_threads=1, region_bytes=40 << 20, transport='loop', token_digest='ab' * 32)\n"
        "a = C.Proxy(cfg)\n"
        "try:\n    C.Proxy(cfg)\n    print('SECOND CREATED')\n"
        "except Unsupported as e:\n    print('REFUSED', e)\n")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare -m is not permitted here")
    out = subprocess.run(["unshare", "-m", "sh", "-c",
                          f"mount -t tmpfs -o size=64m tmpfs /dev/shm && {sys.executable} {script}"],
                         capture_output=True, text=True, timeout=120)
    assert "REFUSED" in out.stdout and "/dev/shm" in out.stdout, out.stdout + out.stderr
