"""Hostile calls of the native module `uccl_ep._C`: protocol encoders, the host FIFO, the receiver,
the proxy (construction, every method, calls in the wrong order, hostile peers, dead and stalled
peers), the host executor's movers and the GPU-path helpers. Built as a list of `Case`s; the
worker (native_worker.py) runs them with a `NativeCtx`."""

from __future__ import annotations

import hashlib
import itertools
import math

import numpy as np

from . import Case

NAN, INF = math.nan, math.inf
_seq = itertools.count()


class NativeCtx:
    """What the cases call into: the module, a connected 2-rank group, and fresh groups for cases
    that leave a group failed (those are stopped after the case)."""

    def __init__(self) -> None:
        from uccl_ep.proxy import native
        self.C = native()
        self._group = None
        self._fresh: list = []

    def config(self, rank=0, world=2, transport="loop", **kw):
        digest = hashlib.sha256(f"hostile-{next(_seq)}".encode()).hexdigest()
        cfg = dict(rank=rank, num_ranks=world, num_threads=1, fifos_per_thread=2, num_counters=32,
                   region_bytes=1 << 16, transport=transport, token_digest=digest, timeout_s=5.0)
        cfg.update(kw)
        return cfg

    def make_group(self, world=2, start=True, **kw):
        cfg = self.config(world=world, **kw)
        ps = [self.C.Proxy(dict(cfg, rank=r)) for r in range(world)]
        if start:
            infos = [p.local_info() for p in ps]
            for p in ps:
                p.connect(infos)
            for p in ps:
                p.finalize_setup()
                p.start()
        self._fresh.extend(ps)
        return ps

    @property
    def group(self):
        """A healthy started group shared by the cases that only pass bad arguments."""
        if self._group is None or any(p.failed for p in self._group):
            self._group = self.make_group()
            self._fresh = [p for p in self._fresh if p not in self._group]
        return self._group

    def after_case(self) -> None:
        for p in self._fresh:
            p.stop()
        self._fresh = []


def _bad_ints(name: str, call, values, expect=()) -> list[Case]:
    return [Case(f"{name}={v!r}", (lambda ctx, v=v: call(ctx, v)), expect) for v in values]


def _encoder_cases() -> list[Case]:
    out: list[Case] = []
    base = dict(dst=1, src_off=0, dst_off=0, len=16, counter=0)
    bad = {"dst": [-1, 4096, 4097, 2**64, 1.5, "1", None, True, NAN],
           "src_off": [-16, 8, 2**35, 2**40, 2**64, NAN, "0"],
           "dst_off": [-16, 24, 2**35, 2**40, INF],
           "len": [-1, 2**24, 2**24 + 64, 2**32, NAN, b"16"],
           "counter": [-1, 8192, 2**32, 0.0]}
    for field, values in bad.items():
        for v in values:
            args = dict(base, **{field: v})
            out.append(Case(f"encode_counted_write({field}={v!r})",
                            lambda ctx, a=args: ctx.C.encode_counted_write(a["dst"], a["src_off"], a["dst_off"],
                                                                           a["len"], a["counter"])))
    for field, v in (("counter", 1024), ("counter", 8191), ("increment", 512), ("increment", -1), ("len", 2**24),
                     ("dst", 4096), ("src_off", 2**41)):
        args = dict(dict(base, increment=1), **{field: v})
        out.append(Case(f"encode_ordered_write({field}={v!r})",
                        lambda ctx, a=args: ctx.C.encode_ordered_write(a["dst"], a["src_off"], a["dst_off"], a["len"],
                                                                       a["counter"], a["increment"])))
    for args in ((1, 0, 2**15, False), (1, 0, -(2**15) - 1, False), (1, 8192, 1, True), (4096, 0, 1, True),
                 (1, 0, 1, "yes"), (1, 0, 1, 2), (1, -1, 1, False), (1, 0, NAN, False)):
        out.append(Case(f"encode_atomic{args!r}", lambda ctx, a=args: ctx.C.encode_atomic(*a)))
    out += [Case("encode_quiet('x')", lambda ctx: ctx.C.encode_quiet("x")),
            Case("encode_barrier(2)", lambda ctx: ctx.C.encode_barrier(2)),
            Case("decode_cmd(-1, 0)", lambda ctx: ctx.C.decode_cmd(-1, 0)),
            Case("decode_cmd(2**64, 0)", lambda ctx: ctx.C.decode_cmd(2**64, 0)),
            Case("decode_cmd('a', 0)", lambda ctx: ctx.C.decode_cmd("a", 0)),
            Case("imm_counted(8192)", lambda ctx: ctx.C.imm_counted(8192)),
            Case("imm_ordered(counter=1024)", lambda ctx: ctx.C.imm_ordered(1024, 0, 1)),
            Case("imm_ordered(seq=2048)", lambda ctx: ctx.C.imm_ordered(0, 2048, 1)),
            Case("imm_ordered(increment=512)", lambda ctx: ctx.C.imm_ordered(0, 0, 512)),
            Case("imm_atomic(value=40000)", lambda ctx: ctx.C.imm_atomic(0, 40000, False)),
            Case("imm_control(op=64)", lambda ctx: ctx.C.imm_control(64, 0)),
            Case("imm_control(arg=2**24)", lambda ctx: ctx.C.imm_control(1, 2**24)),
            Case("imm_decode(2**32)", lambda ctx: ctx.C.imm_decode(2**32)),
            Case("imm_decode(-1)", lambda ctx: ctx.C.imm_decode(-1))]
    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    ok = dict(dst=i64(1), src_off=i64(0), dst_off=i64(0), len=i64(16), counter=i64(0), increment=i64(1))
    for name, kw in (("mismatched lengths", dict(src_off=i64(0, 16))), ("float array", dict(dst=np.array([1.0]))),
                     ("2-D array", dict(len=np.zeros((1, 1), dtype=np.int64))), ("list", dict(counter=[0])),
                     ("dst out of range", dict(dst=i64(5000))), ("len over 24 bits", dict(len=i64(2**24))),
                     ("misaligned offset", dict(dst_off=i64(8))), ("negative offset", dict(src_off=i64(-16))),
                     ("non-contiguous", dict(dst=np.ones(8, dtype=np.int64)[::2]))):
        a = dict(ok, **kw)
        out.append(Case(f"encode_writes({name})",
                        lambda ctx, a=a: ctx.C.encode_writes(a["dst"], a["src_off"], a["dst_off"], a["len"],
                                                             a["counter"], a["increment"], False)))
    out.append(Case("encode_writes(ordered counter 1024)",
                    lambda ctx: ctx.C.encode_writes(i64(1), i64(0), i64(0), i64(16), i64(1024), i64(1), True)))
    return out


def _fifo_receiver_cases() -> list[Case]:
    out: list[Case] = []
    out += _bad_ints("HostFifo(capacity)", lambda ctx, v: ctx.C.HostFifo(v), [0, 1, 3, 2**25, -1, "8", 8.0])
    push = lambda ctx, w0=0, w1=0, t=1.0: ctx.C.HostFifo(8).push(w0, w1, t)  # noqa: E731
    out += [Case(f"HostFifo.push(timeout_s={t!r})", lambda ctx, t=t: push(ctx, t=t)) for t in (NAN, INF, -1.0, 0, "1")]
    out += [Case("HostFifo.push(word0=-1)", lambda ctx: push(ctx, w0=-1)),
            Case("HostFifo.push(word1=2**64)", lambda ctx: push(ctx, w1=2**64)),
            Case("HostFifo.pop() on an empty FIFO", lambda ctx: ctx.C.HostFifo(8).pop()),
            Case("HostFifo.publish_completed(past pushed)", lambda ctx: ctx.C.HostFifo(8).publish_completed(10**6)),
            Case("HostFifo.publish_completed(-1)", lambda ctx: ctx.C.HostFifo(8).publish_completed(-1)),
            Case("HostFifo.set_status(3)", lambda ctx: ctx.C.HostFifo(8).set_status(3)),
            Case("HostFifo.set_status(-1)", lambda ctx: ctx.C.HostFifo(8).set_status(-1)),
            Case("HostFifo.check_completion(-1)", lambda ctx: ctx.C.HostFifo(8).check_completion(-1))]
    out += _bad_ints("Receiver(num_ranks)", lambda ctx, v: ctx.C.Receiver(v, 8), [0, -1, 5000, 2**40])
    out += _bad_ints("Receiver(num_counters)", lambda ctx, v: ctx.C.Receiver(2, v), [0, 10**6, -3])
    out += _bad_ints("Receiver.on_imm(imm)", lambda ctx, v: ctx.C.Receiver(2, 8).on_imm(0, v), [2**32, -1, "x"])
    out += _bad_ints("Receiver.on_imm(src)", lambda ctx, v: ctx.C.Receiver(2, 8).on_imm(v, 0), [2**40, None])
    for args in ((3, 1, 10, 5.0), (8, 0, 10, 5.0), (8, 10**6, 10, 5.0), (8, 1, -1, 5.0), (8, 1, 10, NAN),
                 (8, 1, 10, 5.0, -1)):
        out.append(Case(f"fifo_stress{args!r}", lambda ctx, a=args: ctx.C.fifo_stress(*a)))
    return out


def _config_cases() -> list[Case]:
    bad = [("rank", "0"), ("rank", -1), ("rank", 2), ("num_ranks", 0), ("num_ranks", 5000), ("num_ranks", 2**40),
           ("ranks_per_node", 3), ("num_threads", 0), ("num_threads", 65), ("fifos_per_thread", 0),
           ("fifo_capacity", 3), ("fifo_capacity", 2**30), ("num_counters", 0), ("num_counters", 10**6),
           ("region_bytes", 2**40), ("region_bytes", -1), ("external_region", 12345), ("external_region", -8),
           ("transport", "carrier-pigeon"), ("transport", 7), ("token_digest", "abc"), ("timeout_s", NAN),
           ("timeout_s", INF), ("timeout_s", 0), ("timeout_s", -1), ("heartbeat_s", -1.0), ("heartbeat_s", NAN),
           ("idle_sleep_ns", "x"), ("check_remote_bounds", 2), ("cpus", "a-b"), ("fault_reorder", 2.0),
           ("fault_reorder", NAN), ("fault_tear", -0.5), ("fault_max_pieces", 1), ("max_inflight", 0),
           ("domains", " , "), ("ipc_copy", "gpu"), ("nonsense", 1)]
    from uccl_ep.errors import InvalidArgument, Unsupported
    out = []
    for key, value in bad:
        expect = (InvalidArgument, Unsupported) if key in ("transport", "ipc_copy", "domains") else ()
        extra = {"transport": "ipc"} if key == "ipc_copy" else {}
        out.append(Case(f"Proxy(config {key}={value!r})",
                        lambda ctx, k=key, v=value, e=extra: ctx.C.Proxy(dict(ctx.config(**e), **{k: v})), expect))
    out += [Case("Proxy(config not a dict)", lambda ctx: ctx.C.Proxy([("rank", 0)])),
            Case("Proxy(config with a non-str key)", lambda ctx: ctx.C.Proxy({1: 2})),
            Case("Proxy(external_region of another size)",
                 lambda ctx: ctx.C.Proxy(dict(ctx.config(transport="fabric"), external_region=4096, region_bytes=1 << 20)))]
    return out


def _proxy_method_cases() -> list[Case]:
    from uccl_ep.errors import Aborted, InvalidArgument, PeerFailure, PeerProtocolError, Timeout
    g = lambda ctx: ctx.group[0]  # noqa: E731
    out: list[Case] = []
    for src, c in ((10**6, 0), (0, 10**9), (-5, 0), (2, 0), (0, 32), (0, -1), ("a", 0), (0, None), (2**64, 0)):
        out.append(Case(f"Proxy.counter({src!r}, {c!r})", lambda ctx, s=src, c=c: g(ctx).counter(s, c)))
    out += _bad_ints("Proxy.peer_dead(peer)", lambda ctx, v: g(ctx).peer_dead(v), [10**9, -1, 2, "1", 1.0])
    out += _bad_ints("Proxy.set_excluded(peer)", lambda ctx, v: g(ctx).set_excluded(v, True), [5, -1, 10**12])
    out.append(Case("Proxy.set_excluded(excluded='yes')", lambda ctx: g(ctx).set_excluded(1, "yes")))
    wc = lambda ctx, src=1, c=0, t=1, to=1.0, ph="x": g(ctx).wait_counter(src, c, t, to, ph)  # noqa: E731
    out += [Case(f"Proxy.wait_counter(timeout_s={v!r})", lambda ctx, v=v: wc(ctx, to=v)) for v in (NAN, INF, -1.0, 0.0, 1e9, "1")]
    out += [Case("Proxy.wait_counter(src=7)", lambda ctx: wc(ctx, src=7)),
            Case("Proxy.wait_counter(counter=10**6)", lambda ctx: wc(ctx, c=10**6)),
            Case("Proxy.wait_counter(target=2**63)", lambda ctx: wc(ctx, t=2**63)),
            Case("Proxy.wait_counter(phase=5)", lambda ctx: wc(ctx, ph=5)),
            Case("Proxy.wait_counter on a silent peer", lambda ctx: wc(ctx, to=0.2), Timeout)]
    push = lambda ctx, f=0, w0=None, w1=None, t=1.0: g(ctx).push(  # noqa: E731
        f, *(ctx.C.encode_quiet(False) if w0 is None else (w0, w1)), t)
    out += [Case(f"Proxy.push(fifo={f!r})", lambda ctx, f=f: push(ctx, f=f)) for f in (-1, 2, 99, "0")]
    out += [Case("Proxy.push(word0=-1)", lambda ctx: push(ctx, w0=-1, w1=0)),
            Case("Proxy.push(word1=2**64)", lambda ctx: push(ctx, w0=0, w1=2**64)),
            Case("Proxy.push(timeout_s=nan)", lambda ctx: push(ctx, t=NAN)),
            Case("Proxy.push(timeout_s=inf)", lambda ctx: push(ctx, t=INF))]
    out += [Case("Proxy.push_batch(shape [n, 3])", lambda ctx: g(ctx).push_batch(0, np.zeros((2, 3), np.uint64), 1.0)),
            Case("Proxy.push_batch(int32 rows)", lambda ctx: g(ctx).push_batch(0, np.zeros((2, 2), np.int32), 1.0)),
            Case("Proxy.push_batch(no rows)", lambda ctx: g(ctx).push_batch(0, np.zeros((0, 2), np.uint64), 1.0)),
            Case("Proxy.push_batch(a list)", lambda ctx: g(ctx).push_batch(0, [[0, 0]], 1.0)),
            Case("Proxy.push_batch(fifo=9)", lambda ctx: g(ctx).push_batch(9, np.zeros((1, 2), np.uint64), 1.0))]
    out += [Case("Proxy.wait_completion(index never pushed)", lambda ctx: g(ctx).wait_completion(0, 10**6, 1.0, "x")),
            Case("Proxy.wait_completion(fifo=5)", lambda ctx: g(ctx).wait_completion(5, 0, 1.0, "x")),
            Case("Proxy.wait_completion(index=-1)", lambda ctx: g(ctx).wait_completion(0, -1, 1.0, "x")),
            Case("Proxy.wait_completion(timeout_s=nan)",
                 lambda ctx: g(ctx).wait_completion(0, g(ctx).push(0, *ctx.C.encode_quiet(False), 1.0), NAN, "x")),
            Case("Proxy.fifo_layout(99)", lambda ctx: g(ctx).fifo_layout(99)),
            Case("Proxy.fifo_layout(-1)", lambda ctx: g(ctx).fifo_layout(-1)),
            Case("Proxy.check_completion(99, 0)", lambda ctx: g(ctx).check_completion(99, 0)),
            Case("Proxy.check_completion(0, -1)", lambda ctx: g(ctx).check_completion(0, -1))]
    rl = dict(producers=1, per_producer=1, dst=1, write_bytes=16, src_off=0, dst_off=0, slots=1, fence=False, timeout_s=5.0)
    for k, v in (("producers", 0), ("producers", 10**6), ("dst", 5), ("dst", -2), ("write_bytes", 2**24),
                 ("src_off", 8), ("dst_off", 2**40), ("slots", 0), ("timeout_s", NAN), ("fence", "no"),
                 ("per_producer", -1), ("write_bytes", 24)):
        kw = dict(rl, **{k: v}, **({"slots": 2} if (k, v) == ("write_bytes", 24) else {}))
        out.append(Case(f"Proxy.run_load({k}={v!r})", lambda ctx, kw=kw: g(ctx).run_load(**kw)))
    # calls in the wrong order
    out += [Case("Proxy.connect() twice", lambda ctx: g(ctx).connect([p.local_info() for p in ctx.group])),
            Case("Proxy.start() before connect()", lambda ctx: ctx.make_group(start=False)[0].start()),
            Case("Proxy.connect(wrong count)", lambda ctx: (lambda ps: ps[0].connect([ps[0].local_info()]))(
                ctx.make_group(start=False))),
            Case("Proxy.connect(garbage records)", lambda ctx: ctx.make_group(start=False)[0].connect([b"x", b"y"]),
                 PeerProtocolError),
            Case("Proxy.connect(not bytes)", lambda ctx: ctx.make_group(start=False)[0].connect([1, 2])),
            Case("Proxy.connect(not a list)", lambda ctx: ctx.make_group(start=False)[0].connect(b"xx")),
            Case("Proxy.connect(the same record twice)", lambda ctx: (lambda ps: ps[0].connect(
                [ps[0].local_info(), ps[0].local_info()]))(ctx.make_group(start=False)), (InvalidArgument, PeerProtocolError)),
            Case("Proxy.connect(another job's records)", lambda ctx: (lambda a, b: a[0].connect(
                [a[0].local_info(), b[1].local_info()]))(ctx.make_group(start=False), ctx.make_group(start=False)),
                 PeerProtocolError),
            Case("Proxy.push() after stop()", lambda ctx: (lambda ps: (ps[0].stop(), ps[0].push(
                0, *ctx.C.encode_quiet(False), 1.0)))(ctx.make_group()), Aborted),
            Case("Proxy.start() after stop()", lambda ctx: (lambda ps: (ps[0].stop(), ps[0].start()))(
                ctx.make_group(start=False)), (InvalidArgument, Aborted)),
            Case("Proxy.wait_counter() after stop()", lambda ctx: (lambda ps: (ps[0].stop(), ps[0].wait_counter(
                1, 0, 1, 1.0, "x")))(ctx.make_group()), Aborted)]
    # hostile peers: commands and records that break the protocol
    def bad_cmd(ctx, w0, w1):
        ps = ctx.make_group()
        ps[0].push(0, w0, w1, 1.0)
        ps[0].wait_counter(1, 0, 1, 3.0, "hostile command")
    enc = lambda ctx: ctx.C  # noqa: E731
    for name, words in (("reserved bits", lambda C: (C.encode_counted_write(1, 0, 0, 16, 0)[0] | (1 << 62), 0)),
                        ("invalid type", lambda C: (7, 0)), ("zero command", lambda C: (0, 0)),
                        ("counter past num_counters", lambda C: C.encode_atomic(1, 100, 1, False)),
                        ("write past the peer's region", lambda C: C.encode_counted_write(1, 0, 1 << 20, 16, 0)),
                        ("source past this region", lambda C: C.encode_counted_write(1, 1 << 20, 0, 16, 0)),
                        ("fenced atomic with value 0", lambda C: C.encode_atomic(1, 0, 0, True)),
                        ("ordered write on counter 100 of 32", lambda C: C.encode_ordered_write(1, 0, 0, 16, 100, 1))):
        out.append(Case(f"hostile command: {name}", lambda ctx, w=words: bad_cmd(ctx, *w(enc(ctx))), PeerProtocolError))

    def receiver_checked(ctx, transport):
        ps = ctx.make_group(transport=transport, check_remote_bounds=False, **(
            dict(fault_seed=3, fault_reorder=1.0, fault_max_delay=8, fault_tear=1.0) if "fault" in transport else {}))
        ps[0].push(0, *ctx.C.encode_counted_write(1, 0, (1 << 16) - 16, 64, 0), 1.0)
        ps[1].wait_counter(0, 0, 1, 4.0, "write outside the region")
    for transport in ("loop", "fault:loop", "ipc", "fabric", "fault:fabric"):
        from uccl_ep.proxy import transport_unavailable_reason
        if transport_unavailable_reason(transport.replace("fault:", "")) is None:
            out.append(Case(f"receiver check ({transport}): write outside its region",
                            lambda ctx, t=transport: receiver_checked(ctx, t), PeerProtocolError))

    # dead and stalled peers
    def departed(ctx):
        ps = ctx.make_group(timeout_s=2.0)
        ps[1].stop()
        ps[0].wait_counter(1, 0, 1, 2.0, "peer left")
    out += [Case("peer stopped (goodbye) while waited for", departed, PeerFailure),
            Case("peer never started (silent)", lambda ctx: (lambda ps: ps[0].wait_counter(1, 0, 1, 0.3, "x"))(
                _half_started(ctx)), (Timeout, PeerFailure))]
    return out


def _half_started(ctx):
    ps = ctx.make_group(start=False, timeout_s=2.0)
    infos = [p.local_info() for p in ps]
    for p in ps:
        p.connect(infos)
    ps[0].finalize_setup()
    ps[0].start()
    return ps


def _executor_cases() -> list[Case]:
    i32 = lambda *v: np.array(v, dtype=np.int32)  # noqa: E731
    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    out: list[Case] = []
    ok = dict(dst=i32(1), src_off=i64(0), dst_off=i64(0), counter=i32(0), len=64, adst=i32(1), acounter=i32(0),
              avalue=i32(2), afenced=np.array([1], np.uint8), threads=1, timeout_s=5.0)

    def pc(ctx, kw):
        a = dict(ok, **kw)
        ctx.C.push_counted(ctx.group[0], a["dst"], a["src_off"], a["dst_off"], a["counter"], a["len"], a["adst"],
                           a["acounter"], a["avalue"], a["afenced"], a["threads"], a["timeout_s"])
    for name, kw in (("src_off=2**40", dict(src_off=i64(2**40))), ("dst=2", dict(dst=i32(2))),
                     ("dst=-1", dict(dst=i32(-1))), ("counter=32", dict(counter=i32(32))),
                     ("dst_off misaligned", dict(dst_off=i64(8))), ("len=2**24", dict(len=2**24)),
                     ("len=-1", dict(len=-1)), ("dst as int64", dict(dst=i64(1))),
                     ("lengths differ", dict(src_off=i64(0, 16))), ("atomic_dst=9", dict(adst=i32(9))),
                     ("atomic fenced=2", dict(afenced=np.array([2], np.uint8))),
                     ("atomic value 0 fenced", dict(avalue=i32(0))), ("atomic value 40000", dict(avalue=i32(40000))),
                     ("threads=0", dict(threads=0)), ("threads=10**6", dict(threads=10**6)),
                     ("timeout_s=nan", dict(timeout_s=NAN)), ("src_off past the region", dict(src_off=i64(1 << 16)))):
        out.append(Case(f"push_counted({name})", lambda ctx, kw=kw: pc(ctx, kw)))

    def wcs(ctx, src=i32(1), counter=i32(0), target=i64(1), t=1.0, phase="x"):
        ctx.C.wait_counters(ctx.group[0], src, counter, target, t, phase)
    out += [Case("wait_counters(src=5)", lambda ctx: wcs(ctx, src=i32(5))),
            Case("wait_counters(counter=-1)", lambda ctx: wcs(ctx, counter=i32(-1))),
            Case("wait_counters(lengths differ)", lambda ctx: wcs(ctx, target=i64(1, 2))),
            Case("wait_counters(timeout_s=inf)", lambda ctx: wcs(ctx, t=INF)),
            Case("wait_counters(phase=None)", lambda ctx: wcs(ctx, phase=None)),
            Case("wait_counters(float targets)", lambda ctx: wcs(ctx, target=np.array([1.0])))]
    spec = dict(msg_bytes=64, ring_slots=4, chunk=1, num_rings=1, recv_base=0, send_base=4096, threads=1, timeout_s=2.0,
                phase="x")

    def rp(ctx, spec_kw=None, **arrays):
        eng = ctx.C.RingEngine(ctx.group[0])
        a = dict(table=np.zeros((2, 64), np.uint8), out=np.zeros((2, 64), np.uint8), send_dst=i32(), send_ring=i32(),
                 send_start=i64(), send_count=i64(), send_rows=i64(), recv_src=i32(), recv_ring=i32(),
                 recv_out_row=i64(), recv_count=i64())
        a.update(arrays)
        eng.run_phase(dict(spec, **(spec_kw or {})), *a.values())
    for k, v in (("msg_bytes", 8), ("msg_bytes", 24), ("ring_slots", 0), ("ring_slots", 10**6), ("chunk", 0),
                 ("num_rings", 0), ("num_rings", 10**4), ("recv_base", 8), ("send_base", 2**40), ("threads", 0),
                 ("threads", 10**5), ("timeout_s", NAN), ("phase", 3), ("first_ring", 600)):
        out.append(Case(f"RingEngine.run_phase(spec {k}={v!r})", lambda ctx, k=k, v=v: rp(ctx, {k: v})))
    out += [Case("RingEngine.run_phase(spec missing msg_bytes)",
                 lambda ctx: ctx.C.RingEngine(ctx.group[0]).run_phase({"phase": "x"}, *[np.zeros(0)] * 11)),
            Case("RingEngine.run_phase(spec not a dict)",
                 lambda ctx: ctx.C.RingEngine(ctx.group[0]).run_phase([], *[np.zeros(0)] * 11)),
            Case("RingEngine.run_phase(send row outside the table)",
                 lambda ctx: rp(ctx, send_dst=i32(1), send_ring=i32(0), send_start=i64(0), send_count=i64(1),
                                send_rows=i64(7))),
            Case("RingEngine.run_phase(send_start past send_rows)",
                 lambda ctx: rp(ctx, send_dst=i32(1), send_ring=i32(0), send_start=i64(5), send_count=i64(1),
                                send_rows=i64(0))),
            Case("RingEngine.run_phase(send_dst=9)",
                 lambda ctx: rp(ctx, send_dst=i32(9), send_ring=i32(0), send_start=i64(0), send_count=i64(1),
                                send_rows=i64(0))),
            Case("RingEngine.run_phase(send_ring=-1)",
                 lambda ctx: rp(ctx, send_dst=i32(1), send_ring=i32(-1), send_start=i64(0), send_count=i64(1),
                                send_rows=i64(0))),
            Case("RingEngine.run_phase(recv rows past out)",
                 lambda ctx: rp(ctx, recv_src=i32(1), recv_ring=i32(0), recv_out_row=i64(1), recv_count=i64(5))),
            Case("RingEngine.run_phase(table rows of another width)",
                 lambda ctx: rp(ctx, table=np.zeros((2, 32), np.uint8))),
            Case("RingEngine.run_phase(read-only out)",
                 lambda ctx: rp(ctx, out=np.broadcast_to(np.zeros(64, np.uint8), (2, 64)))),
            Case("RingEngine(num_counters too small)",
                 lambda ctx: ctx.C.RingEngine(ctx.make_group(num_counters=8)[0]))]
    return out


def _gpu_path_cases() -> list[Case]:
    from uccl_ep.errors import MissingDependency
    out = [Case("proxy_fifo_layout(index=99)", lambda ctx: ctx.C.proxy_fifo_layout(ctx.group[0], 99)),
           Case("proxy_fifo_layout(index=-1)", lambda ctx: ctx.C.proxy_fifo_layout(ctx.group[0], -1))]
    good = dict(slots=64, head=8, tail=16, tail_cache=24, completed=32, status=40, capacity=8, capacity_log2=3)
    for k, v in (("capacity", 6), ("capacity_log2", 0), ("capacity_log2", 40), ("head", 0), ("status", 12),
                 ("slots", -8)):
        kw = dict(good, **{k: v})
        out.append(Case(f"pack_fifo_layout({k}={v!r})", lambda ctx, kw=kw: ctx.C.pack_fifo_layout(**kw)))
    out += [Case("transport_unavailable_reason(5)", lambda ctx: ctx.C.transport_unavailable_reason(5)),
            Case("fabric_domains(None)", lambda ctx: ctx.C.fabric_domains(None)),
            Case("fabric_probe(hmem_cuda_device=5000)", lambda ctx: ctx.C.fabric_probe("", "", 5000)),
            Case("fabric_probe(provider=1)", lambda ctx: ctx.C.fabric_probe(1))]
    # forged driver handles: refused before the driver would dereference them (with or without a GPU)
    out += [Case("cuda.launch(forged function)", lambda ctx: ctx.C.cuda.launch(0, 0xDEAD0, (1, 1, 1), (32, 1, 1), 0, 0, b"")),
            Case("cuda.module_function(forged module)", lambda ctx: ctx.C.cuda.module_function(0xBEEF0, "k")),
            Case("cuda.function_set_max_dynamic_smem(forged function)",
                 lambda ctx: ctx.C.cuda.function_set_max_dynamic_smem(8, 1024)),
            Case("cuda.ce_chain(forged wait function)", lambda ctx: ctx.C.cuda.ce_chain(0, 0, 8, b"")),
            Case("cuda.ipc_open_handle(3 bytes)", lambda ctx: ctx.C.cuda.ipc_open_handle(0, b"abc"))]
    from uccl_ep.proxy import native
    if not native().cuda.available()[0]:  # the raw driver layer: without libcuda every call says so
        cu = lambda ctx: ctx.C.cuda  # noqa: E731
        for name, call in (("mem_alloc", lambda c: c.mem_alloc(0, 1 << 20)), ("mem_free", lambda c: c.mem_free(0, 8)),
                           ("host_alloc_mapped", lambda c: c.host_alloc_mapped(0, 4096)),
                           ("memcpy_dtoh(2**62 bytes)", lambda c: c.memcpy_dtoh(0, 8, 2**62)),
                           ("memcpy_htod", lambda c: c.memcpy_htod(0, 8, b"x")), ("device_count", lambda c: c.device_count()),
                           ("ipc_get_handle", lambda c: c.ipc_get_handle(0, 8)),
                           ("module_load(garbage)", lambda c: c.module_load(0, b"not a cubin")),
                           ("host_register(forged pointer)", lambda c: c.host_register(0, 8, 4096)),
                           ("synchronize", lambda c: c.synchronize(0))):
            out.append(Case(f"cuda.{name} without a driver", lambda ctx, f=call: f(cu(ctx)), MissingDependency))
    return out


def cases() -> list[Case]:
    return _encoder_cases() + _fifo_receiver_cases() + _config_cases() + _proxy_method_cases() + _executor_cases() + \
        _gpu_path_cases()
