"""Randomized LL-pattern and HT-pattern command streams through a running proxy, with every byte
and counter checked. Used by the multi-process transport tests (and usable by hand to check a
provider: ``run_streams(rank, world, proxy, rounds=...)`` on every rank).

Region layout (identical on every rank):
    [0, SEND)                        this rank's source bytes, a seeded random pattern
    LL area: per source s            E experts x MAX_N slots of SLOT bytes (counted writes)
    HT area: per source s, channel c a ring of MAX_TOKENS tokens of TOKEN bytes (ordered writes)

Each round, for every destination d (itself included):
- LL: expert e gets n random writes (random length and source offset) counted under counter e,
  then one fenced atomic carrying n + 1; the receiver waits for the cumulative signal and then
  compares every slot with the sender's pattern;
- HT: channel c gets k ordered writes of 1..MAX_INC tokens each, bumping counter HT_BASE + c by
  the token count; while the counter grows the receiver checks every token it covers at once,
  so a tail that ran ahead of its data (broken ordering) is caught.
Rounds end with a proxy barrier (all ranks), so the areas are reused safely.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import PeerProtocolError

__all__ = ["StreamSpec", "region_bytes_for", "run_streams"]


@dataclass(frozen=True)
class StreamSpec:
    seed: int = 1
    experts: int = 8          # LL counters 0..experts-1
    max_n: int = 6            # LL writes per (dst, expert) per round: 0..max_n
    slot: int = 512           # LL slot bytes (writes are 1..slot bytes)
    channels: int = 4         # HT counters HT_BASE..HT_BASE+channels-1
    max_writes: int = 24      # HT writes per (dst, channel) per round: 1..max_writes
    max_inc: int = 4          # HT tokens per write: 1..max_inc
    token: int = 64           # HT token bytes
    send: int = 1 << 16       # source pattern bytes

    @property
    def ht_base(self) -> int:
        return self.experts

    @property
    def num_counters(self) -> int:
        return self.experts + self.channels

    @property
    def ring_tokens(self) -> int:
        return self.max_writes * self.max_inc


def _ll_bytes_per_src(s: StreamSpec) -> int:
    return s.experts * s.max_n * s.slot


def _ht_bytes_per_src(s: StreamSpec) -> int:
    return s.channels * s.ring_tokens * s.token


def region_bytes_for(spec: StreamSpec, world: int) -> int:
    return spec.send + world * (_ll_bytes_per_src(spec) + _ht_bytes_per_src(spec))


def _pattern(spec: StreamSpec, rank: int) -> np.ndarray:
    return np.random.default_rng([spec.seed, 7, rank]).integers(0, 256, spec.send, dtype=np.uint8)


def _ll_plan(spec: StreamSpec, src: int, dst: int, rnd: int):
    """Per expert: list of (src_off, len) for src's writes to dst in round rnd."""
    rng = np.random.default_rng([spec.seed, 1, src, dst, rnd])
    counts = rng.integers(0, spec.max_n + 1, spec.experts)
    plan = []
    for e in range(spec.experts):
        lens = rng.integers(1, spec.slot + 1, counts[e])
        offs = rng.integers(0, (spec.send - spec.slot) // 16, counts[e]) * 16
        plan.append(list(zip(offs.tolist(), lens.tolist())))
    return plan


def _ht_plan(spec: StreamSpec, src: int, dst: int, rnd: int):
    """Per channel: list of (src_off, tokens) for src's ordered writes to dst in round rnd."""
    rng = np.random.default_rng([spec.seed, 2, src, dst, rnd])
    plan = []
    for _ in range(spec.channels):
        k = int(rng.integers(1, spec.max_writes + 1))
        incs = rng.integers(1, spec.max_inc + 1, k)
        offs = rng.integers(0, (spec.send - spec.max_inc * spec.token) // 16, k) * 16
        plan.append(list(zip(offs.tolist(), incs.tolist())))
    return plan


def _ll_off(spec: StreamSpec, world: int, src: int, e: int, i: int) -> int:
    return spec.send + src * _ll_bytes_per_src(spec) + (e * spec.max_n + i) * spec.slot


def _ht_off(spec: StreamSpec, world: int, src: int, c: int) -> int:
    return spec.send + world * _ll_bytes_per_src(spec) + (src * spec.channels + c) * spec.ring_tokens * spec.token


def _send_round(C, proxy, spec: StreamSpec, rank: int, world: int, rnd: int, timeout_s: float) -> int:
    num_fifos = proxy.num_fifos
    per_fifo: dict[int, list[tuple[int, int]]] = {f: [] for f in range(num_fifos)}
    for dst in range(world):
        for e, writes in enumerate(_ll_plan(spec, rank, dst, rnd)):
            f = e % num_fifos
            for i, (off, n) in enumerate(writes):
                per_fifo[f].append(C.encode_counted_write(dst, off, _ll_off(spec, world, rank, e, i), n, e))
            per_fifo[f].append(C.encode_atomic(dst, e, len(writes) + 1, True))
        for c, writes in enumerate(_ht_plan(spec, rank, dst, rnd)):
            f = (spec.ht_base + c) % num_fifos
            pos = 0
            for off, inc in writes:
                per_fifo[f].append(C.encode_ordered_write(dst, off, _ht_off(spec, world, rank, c) + pos * spec.token,
                                                          inc * spec.token, spec.ht_base + c, inc))
                pos += inc
    total = 0
    for f, cmds in per_fifo.items():
        if cmds:
            proxy.push_batch(f, np.asarray(cmds, dtype=np.uint64), timeout_s)
            total += len(cmds)
    return total


def _check_ll(proxy, region, spec, world, rank, rnd, patterns, targets, timeout_s):
    for src in range(world):
        for e, writes in enumerate(_ll_plan(spec, src, rank, rnd)):
            targets[src, e] += len(writes) + 1
            proxy.wait_counter(src, e, int(targets[src, e]), timeout_s, "streams ll")
            for i, (off, n) in enumerate(writes):
                at = _ll_off(spec, world, src, e, i)
                if not np.array_equal(region[at:at + n], patterns[src][off:off + n]):
                    raise PeerProtocolError(f"rank {rank}: LL round {rnd} write {i} of expert {e} from rank {src} "
                                            f"has wrong bytes after its count signal")


def _check_ht(proxy, region, spec, world, rank, rnd, patterns, targets, timeout_s):
    counters = proxy.counters()
    pending = []
    for src in range(world):
        for c, writes in enumerate(_ht_plan(spec, src, rank, rnd)):
            expected = np.concatenate([patterns[src][off:off + inc * spec.token] for off, inc in writes])
            start = int(targets[src, spec.ht_base + c])
            targets[src, spec.ht_base + c] += sum(inc for _, inc in writes)
            pending.append([src, c, start, 0, expected])
    deadline = time.monotonic() + timeout_s
    while pending:
        still = []
        for item in pending:
            src, c, start, checked, expected = item
            covered = int(counters[src, spec.ht_base + c]) - start
            if covered > checked:
                at = _ht_off(spec, world, src, c)
                lo, hi = checked * spec.token, covered * spec.token
                if hi > expected.size or not np.array_equal(region[at + lo:at + hi], expected[lo:hi]):
                    raise PeerProtocolError(f"rank {rank}: HT round {rnd} channel {c} from rank {src}: the counter "
                                            f"covers {covered} tokens but their bytes are not all there (ordering broken)")
                item[3] = covered
            if item[3] * spec.token < expected.size:
                still.append(item)
        pending = still
        if pending:
            if time.monotonic() > deadline:
                src, c = pending[0][0], pending[0][1]
                proxy.wait_counter(src, spec.ht_base + c, pending[0][2] + pending[0][4].size // spec.token, 0.001,
                                   "streams ht")
            time.sleep(0.0002)


def run_streams(rank: int, world: int, proxy, spec: StreamSpec = StreamSpec(), rounds: int = 3,
                timeout_s: float = 60.0) -> int:
    """Run ``rounds`` rounds on this rank (every rank must call it); returns commands pushed."""
    from .bootstrap import native
    C = native()
    region = proxy.region()
    region[:spec.send] = _pattern(spec, rank)
    patterns = [_pattern(spec, r) for r in range(world)]
    targets = np.zeros((world, spec.num_counters), dtype=np.int64)
    barrier = C.encode_barrier(False)
    # The pattern must be in place on every rank before anyone reads it.
    proxy.wait_completion(0, proxy.push(0, *barrier, timeout_s), timeout_s, "streams setup barrier")
    total = 0
    for rnd in range(rounds):
        total += _send_round(C, proxy, spec, rank, world, rnd, timeout_s)
        _check_ll(proxy, region, spec, world, rank, rnd, patterns, targets, timeout_s)
        _check_ht(proxy, region, spec, world, rank, rnd, patterns, targets, timeout_s)
        proxy.wait_completion(0, proxy.push(0, *barrier, timeout_s), timeout_s, f"streams round {rnd} barrier")
    return total
