"""The `ipc` transport's "kernel" copy engine (ipc_copy="kernel", dma_ring.h) on CPU.

The proxy threads queue one descriptor {dst, src, len, seq} per Write in a ring in host memory and
deliver the Write's immediate only once the ring's `done` word covers it. On a GPU the consumer is
the LL proxy path's copy kernel (ll_proxy_dma.cu); here a Python thread plays it over host regions,
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
    """Executes one proxy thread's copy ring in order, as the copy kernel does (dma_ring.h)."""

    def __init__(self, ring: dict):
        self.cap = ring["capacity"]
        words = (ctypes.c_uint64 * (8 + 4 * self.cap)).from_address(ring["memory"])
        self.words = np.ctypeslib.as_array(words)  # header (8 words), then 4 words per descriptor
        self.next = int(self.words[0])
        self.copied = []  # (dst, src, len) in ring order
        self.torn = 0  # reads that found seq but not every word's lap tag yet: retried, as the kernel does

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
            ctypes.memmove(dst, src, length)
            self.copied.append((dst, src, length))
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
