"""The `ipc` transport's "kernel" copy engine (ipc_copy="kernel", dma_ring.h) on CPU.

The proxy threads queue one descriptor {dst, src, len, seq} per Write in a ring in host memory and
deliver the Write's immediate only once the ring's `done` word covers it. On a GPU the consumer is
the LL proxy path's copy kernel (transport/copy_ring.cu); here a Python thread plays it over host regions,
so the real transport code is checked: descriptor contents and order, nothing delivered before its
copy, every byte and counter after it, torn writes (fault decorator), and the option's errors.

The kernel itself runs only on a GPU: core/tests/gpu/test_cuda_ll_proxy.py.
"""

import ctypes
import threading
import time

import numpy as np
import pytest

from test_proxy import make_group, stop_all
from uccl_ep.errors import Timeout, Unsupported
from uccl_ep.proxy import native

pytestmark = pytest.mark.cpu

C = native()


class RingConsumer:
    """Executes one proxy thread's copy ring in order, as the copy kernel does (dma_ring.h): a
    descriptor with dst 0 is a skip (a Write the proxy dropped), counted and not copied."""

    def __init__(self, ring: dict):
        self.cap = ring["capacity"]
        words = (ctypes.c_uint64 * (8 + 4 * self.cap)).from_address(ring["memory"])
        self.words = np.ctypeslib.as_array(words)  # header (8 words), then 4 words per descriptor
        self.next = int(self.words[0])
        self.copied = []  # (dst, src, len) in ring order
        self.skipped = []  # len of each skip descriptor, in ring order
        self.bytes = 0  # bytes of every descriptor taken (copied or skipped), as the kernel counts them
        self.torn = 0  # reads that found seq but not every word's lap tag yet: retried, as the kernel does

    def launch(self, target: int, status_word: int, timeout_s: float) -> None:
        """One copy-kernel launch (transport/copy_ring.cu): take descriptors until they cover `target` bytes
        (what the send kernels pushed to this proxy thread); bounded, and ended early once the proxy's
        FIFO status word leaves running (the kernel's proxy_wait_ok)."""
        status = np.ctypeslib.as_array((ctypes.c_uint64 * 1).from_address(status_word))
        deadline = time.monotonic() + timeout_s
        while self.bytes < target:
            if not self.poll():
                if int(status[0]) != 0:
                    raise RuntimeError(f"copy kernel: the proxy left running (status {int(status[0])})")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"copy kernel: descriptors cover {self.bytes} of {target} pushed bytes")
                time.sleep(1e-4)
        assert self.bytes == target, (self.bytes, target)

    def poll(self) -> int:
        n = 0
        while True:
            slot = 8 + 4 * (self.next % self.cap)
            dst, src, length, seq = (int(v) for v in self.words[slot:slot + 4])
            if seq != self.next + 1:
                return n
            # every word carries the lap tag (dma_ring.h dma_tag): (lap + 1) mod 128 in bits 57..63;
            # the four words are read without ordering between them, so a word read before the
            # proxy rewrote it carries an older tag, and the slot is read again later
            tag = (self.next // self.cap + 1) & 0x7F
            if (dst >> 57, src >> 57, length >> 57) != (tag,) * 3:
                self.torn += 1
                return n
            dst, src, length = (v & ((1 << 57) - 1) for v in (dst, src, length))
            if dst == 0:
                self.skipped.append(length)
            else:
                ctypes.memmove(dst, src, length)
                self.copied.append((dst, src, length))
            self.bytes += length
            self.next += 1
            self.words[1] = time.time_ns()  # done_ns (diagnostics), as the kernel's %globaltimer
            self.words[0] = self.next  # done: every descriptor below it is copied
            n += 1


def _run(consumers, stop):
    while not stop.is_set():
        if not sum(c.poll() for c in consumers):
            time.sleep(1e-4)


def _push_pattern(ps, world, writes_per_pair, length):
    """Counted writes from every rank to every other, then a fenced Atomic per (src, dst) on counter 0."""
    rng = np.random.default_rng(7)
    for p in ps:
        p.region()[:65536] = rng.integers(0, 256, 65536, dtype=np.uint8)
    expect = []
    for src in range(world):
        for dst in range(world):
            if src == dst:
                continue
            for i in range(writes_per_pair):
                off = 65536 + (src * writes_per_pair + i) * 512
                ps[src].push(dst % ps[src].num_fifos, *C.encode_counted_write(dst, 1024 * i, off, length, 0), 5.0)
                expect.append((src, dst, 1024 * i, off))
            ps[src].push(dst % ps[src].num_fifos, *C.encode_atomic(dst, 0, writes_per_pair + 1, True), 5.0)
    return expect


@pytest.mark.parametrize("transport", ["ipc", "fault:ipc"])
def test_writes_wait_for_their_copy_then_land_in_order(transport):
    world, n, length = 3, 6, 400
    ps = make_group(world, transport, ipc_copy="kernel")
    stop = threading.Event()
    try:
        assert ps[0].transport_name.endswith("ipc:kernel")
        consumers = [[RingConsumer(r) for r in p.copy_rings()] for p in ps]
        expect = _push_pattern(ps, world, n, length)
        # no consumer yet: the descriptors are queued, nothing is delivered
        time.sleep(0.05)
        assert all(int(ps[1].counter(src, 0)) == 0 for src in (0, 2))
        with pytest.raises(Timeout):
            ps[1].wait_counter(0, 0, n + 1, 0.2, "test")
        threads = [threading.Thread(target=_run, args=(cs, stop), daemon=True) for cs in consumers]
        for t in threads:
            t.start()
        for src, dst, soff, doff in expect:
            assert ps[dst].wait_counter(src, 0, n + 1, 10.0, "test") == n + 1
            want = ps[src].region()[soff:soff + length]
            assert np.array_equal(ps[dst].region()[doff:doff + length], want), (src, dst, soff)
        # every Write became descriptors covering exactly its bytes (torn ones: several, in order)
        for src in range(world):
            copied = [c for cons in consumers[src] for c in cons.copied]
            assert sum(length for _, _, length in copied) == (world - 1) * n * length
            if transport == "ipc":
                assert len(copied) == (world - 1) * n
        counters = ps[0].transport_counters()
        assert counters["ipc_kernel_copies"] >= (world - 1) * n
        # the proxy saw `done` move and timed it against the consumer's stamp (same clock here)
        assert counters["ipc_ring_done_seen"] >= 1 and counters["ipc_ring_clock_mismatch"] == 0
        assert counters["ipc_ring_done_seen_ns"] < 10**9 * counters["ipc_ring_done_seen"]
    finally:
        stop.set()
        stop_all(ps)


def test_descriptors_past_the_first_lap_carry_their_tags():
    """More Writes than a ring holds: slots are reused and every word names its lap, so the
    consumer (reading without ordering between words, like the copy kernel) takes a slot only once
    all four words are the current lap's; a producer without the tags would stall it here."""
    ps = make_group(2, "ipc", ipc_copy="kernel", num_threads=1, fifos_per_thread=1)
    stop = threading.Event()
    try:
        ring = ps[0].copy_rings()[0]
        writes = ring["capacity"] + 300
        consumers = [RingConsumer(r) for p in ps for r in p.copy_rings()]
        thread = threading.Thread(target=_run, args=(consumers, stop), daemon=True)
        thread.start()
        ps[0].region()[:4096] = np.arange(4096, dtype=np.uint32).astype(np.uint8)
        for i in range(writes):
            ps[0].push(0, *C.encode_counted_write(1, 16 * (i % 256), 4096 + 16 * (i % 4096), 16, 1), 5.0)
        deadline = time.time() + 30
        while len(consumers[0].copied) < writes and time.time() < deadline:
            time.sleep(0.01)
        assert len(consumers[0].copied) == writes
        assert consumers[0].next == writes > ring["capacity"]
        got = ps[1].region()[4096:4096 + 16 * 256]
        assert np.array_equal(got, ps[0].region()[:16 * 256])
    finally:
        stop.set()
        stop_all(ps)


def test_only_ipc_endpoints_have_rings():
    ps = make_group(2, "ipc")
    try:
        assert ps[0].transport_name.endswith("ipc:host") and ps[0].copy_rings() == [None, None]
    finally:
        stop_all(ps)
    ps = make_group(2, "loop", ipc_copy="kernel")  # the option concerns ipc only
    try:
        assert ps[0].copy_rings() == [None, None]
    finally:
        stop_all(ps)


def test_unknown_copy_engine_is_refused():
    with pytest.raises(Unsupported, match="unknown copy engine 'dma'"):
        make_group(2, "ipc", ipc_copy="dma")


# --------------------------------------------------------------------------------------------------
# a peer that fails while Writes to it are queued (shrink mode masks it; without shrink PeerFailure)
# --------------------------------------------------------------------------------------------------
def _group_with_a_silent_rank(world, transport, silent, excluded=False, **kw):
    """`world` proxies over `transport` (kernel copies) whose rank `silent` connects at bootstrap and
    never starts: no heartbeat, its inbox never drained, as a process killed after set-up. The others
    find it dead after the liveness grace (half of timeout_s); with `excluded` (shrink mode: the LL
    proxy engine excludes every peer) that marks it dead instead of failing their proxies."""
    import hashlib
    import random
    from test_proxy import FAULT
    cfg = dict(num_ranks=world, num_threads=1, fifos_per_thread=1, num_counters=32, region_bytes=1 << 20,
               transport=transport, token_digest=hashlib.sha256(f"t-{random.random()}".encode()).hexdigest(),
               timeout_s=3.0, ipc_copy="kernel", **(FAULT if transport.startswith("fault:") else {}), **kw)
    ps = [C.Proxy(dict(cfg, rank=r)) for r in range(world)]
    infos = [p.local_info() for p in ps]
    for p in ps:
        p.connect(infos)
    for r, p in enumerate(ps):
        p.finalize_setup()
        if r != silent:
            for q in range(world):
                if excluded and q != r:
                    p.set_excluded(q, True)
            p.start()
    return ps


def _wait_until(what, cond, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.005)


@pytest.mark.parametrize("transport", ["ipc", "fault:ipc"])
def test_writes_dropped_for_a_failed_peer_still_reach_the_copy_kernel(transport):
    """Shrink mode on the LL proxy path: rank 1 fails with rank 0's Writes to it in flight. Those
    posted before the failure was found are copied as usual; those the proxy drops after it (dead
    peer) reach the copy ring as skip descriptors, counted and not copied, so the copy kernel's
    launch covers every byte the send kernel pushed and ends. Without them it waited for bytes that
    never came until its timeout (and failed the buffer) instead of letting the receive kernel mask
    the peer. The FIFO completes the dropped commands; the proxy stays healthy."""
    ps = _group_with_a_silent_rank(2, transport, silent=1, excluded=True)
    try:
        p0, p1 = ps
        ring = RingConsumer(p0.copy_rings()[0])
        status = p0.fifo_layout(0)["status"]
        p0.region()[:65536] = np.random.default_rng(3).integers(1, 256, 65536, dtype=np.uint8)
        pushed = 0
        for i in range(3):  # the first op: rank 1 not yet found dead, the Writes are posted
            p0.push(0, *C.encode_counted_write(1, 1024 * i, 4096 + 1024 * i, 1024, 0), 5.0)
            pushed += 1024
        ring.launch(pushed, status, 5.0)
        assert np.array_equal(p1.region()[4096:4096 + 3072], p0.region()[:3072]) and not ring.skipped
        _wait_until("rank 1 marked dead", lambda: p0.peer_dead(1))
        for i in range(4):  # the next op: dropped, as skips
            p0.push(0, *C.encode_counted_write(1, 1024 * i, 65536 + 2048 * i, 2000, 0), 5.0)
            pushed += 2000
        last = p0.push(0, *C.encode_atomic(1, 0, 5, True), 5.0)  # dropped, no bytes: no descriptor
        ring.launch(pushed, status, 5.0)
        assert ring.skipped == [2000] * 4
        assert not p1.region()[65536:65536 + 4 * 2048].any()  # nothing copied into the dead rank
        p0.wait_completion(0, last, 5.0, "test")
        assert p0.transport_counters()["ipc_ring_skipped"] == 4
        p0.raise_if_failed()
    finally:
        stop_all(ps)


def test_without_shrink_the_copy_kernel_ends_with_the_proxys_peer_failure():
    """Without shrink a failed peer fails the proxy (PeerFailure naming it, within the timeout) and
    the FIFO status word leaves running: a copy kernel waiting for descriptors of Writes the proxy
    never posted sees it and ends at once (the executor then raises the proxy's PeerFailure) rather
    than waiting out its timeout."""
    from uccl_ep.errors import PeerFailure
    ps = _group_with_a_silent_rank(2, "ipc", silent=1)
    try:
        p0 = ps[0]
        t0 = time.monotonic()
        with pytest.raises(PeerFailure) as info:
            p0.wait_counter(1, 0, 1, 5.0, "test")
        assert time.monotonic() - t0 < 3.0 and info.value.peer == 1 and info.value.rank == 0
        ring = RingConsumer(p0.copy_rings()[0])
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="left running"):
            ring.launch(1024, p0.fifo_layout(0)["status"], 5.0)  # pushed by a send kernel, never posted
        assert time.monotonic() - t0 < 0.5
    finally:
        stop_all(ps)


def test_normal_mode_copy_role_counts_skip_descriptors():
    """The normal-mode copy role (device/ht_dma.cuh, emulated by ht_proxy_emulator.DmaRole) counts a
    skip descriptor's bytes against what its senders pushed and copies nothing, so a launch whose
    Writes to a failed peer were dropped ends like any other."""
    from ht_proxy_emulator import DmaRole
    ps = _group_with_a_silent_rank(2, "ipc", silent=1, excluded=True)
    try:
        p0, p1 = ps
        _wait_until("rank 1 marked dead", lambda: p0.peer_dead(1))
        # HtDmaContext (dma_ring.h): rings, pushed, state, ..., signals (word 7), num_rings (word 10)
        table = np.array([p0.copy_rings()[0]["memory"]], np.uint64)
        pushed, state, signals = np.zeros(1, np.uint64), np.zeros(16, np.uint64), np.zeros(1, np.uint64)
        ctx = np.zeros(16, np.uint64)
        ctx[[0, 1, 2, 7, 10]] = [table.ctypes.data, pushed.ctypes.data, state.ctypes.data, signals.ctypes.data, 1]
        role = DmaRole({"dma": ctx.ctypes.data, "dma_blocks": 1, "dma_senders": 1})
        p0.region()[:8192] = 7
        for i in range(3):
            role.count(0, 4096)
            p0.push(0, *C.encode_counted_write(1, 0, 4096 * i, 4096, 0), 5.0)
        role.signal()
        deadline = time.monotonic() + 5.0
        for progress in role.run():
            assert time.monotonic() < deadline, "the copy role waited for bytes that never came"
            if not progress:
                time.sleep(1e-4)
        assert int(state[0]) == 3 and int(state[1]) == 3 * 4096  # descriptors and bytes taken
        assert not p1.region()[:3 * 4096].any()
    finally:
        stop_all(ps)
