"""One proxy session per Buffer: the rank's proxy (bootstrap, transport endpoints, threads,
registered region, FIFOs, counters), started once and shared by every engine of the Buffer that
needs a proxy -- normal mode and low-latency mode alike.

    session = ProxySession(group, rank=r, num_ranks=R, region_bytes=..., num_counters=...)   # collective
    session.proxy.push(...)                      # engines push and wait through it
    session.reset_counters(first, count)         # one engine's counters only; the others' keep growing
    session.close()                              # stops the proxy exactly once (idempotent)

Executors open it in their constructor, while every rank constructs its Buffer: the bootstrap is a
collective, and an engine made later (its mode's first call) would run it on the ranks that make
that call only. The cuda executor's session (uccl_ep/cuda/proxy_session.py) adds the device side:
FIFOs and counters mapped for the kernels, the copy rings, and their hand-over between engines.

Counter ranges: engines that share a session must not share counters. The host executor's two
modes use one counter plan (protocol/layout.py); the cuda executor gives each engine its own range
(cuda/proxy_session.py), and an engine that resets its counters resets only its range.

Shrink mode (enable_shrink): every peer is excluded in the proxy from the start, so a peer that
dies is marked dead (its commands dropped, waits on it end) instead of failing the proxy under
every engine; the low-latency kernels mask it, and normal mode's bounded waits end in a typed error.
"""

from __future__ import annotations

import ctypes

from ..errors import Aborted
from .native import native

__all__ = ["ProxySession"]


class ProxySession:
    """The proxy of one Buffer on this rank (see the module doc). ``start_kw`` are `start_proxy`'s."""

    def __init__(self, group, *, rank: int, num_ranks: int, num_counters: int, enable_shrink: bool = False,
                 **start_kw) -> None:
        from . import start_proxy  # looked up at call time (tests replace it)
        self.rank, self.num_ranks, self.num_counters = rank, num_ranks, int(num_counters)
        self.proxy = start_proxy(group, num_counters=self.num_counters, **start_kw)
        self._closed = False
        if enable_shrink:
            for j in range(num_ranks):
                if j != rank:
                    self.proxy.set_excluded(j, True)

    @property
    def closed(self) -> bool:
        return self._closed

    def reset_counters(self, first: int = 0, count: int | None = None) -> None:
        """Zero counters [first, first + count) of every source (all of them by default). Only while
        nothing in flight targets them (an engine's clean, between barriers)."""
        n = self.num_counters
        count = n - first if count is None else count
        if not 0 <= first <= first + count <= n:
            raise ValueError(f"counters [{first}, {first + count}) outside [0, {n})")
        if first == 0 and count == n:
            self.proxy.reset_counters()
            return
        addr, nbytes = native().proxy_counters_address(self.proxy)
        if nbytes != 8 * n * self.num_ranks:
            raise RuntimeError(f"the proxy holds {nbytes} bytes of counters; the session expects "
                               f"{self.num_ranks} x {n} int64")
        for src in range(self.num_ranks):
            ctypes.memset(addr + 8 * (src * n + first), 0, 8 * count)

    def failure(self, what: str = "") -> Exception:
        """The proxy's own error (it stopped or failed under an engine), as an exception."""
        try:
            self.proxy.raise_if_failed()
        except Exception as e:  # noqa: BLE001 - the typed uccl_ep error of the proxy
            return e
        return Aborted(f"rank {self.rank}: the CPU proxy{' of ' + what if what else ''} stopped while a kernel pushed "
                       "to or waited on it")

    def transport_counters(self) -> dict:
        return dict(self.proxy.transport_counters()) if not self._closed else {}

    def close(self) -> None:
        """Stop the proxy (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        self.proxy.stop()
