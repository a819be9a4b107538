"""A CPU stand-in for the proxy-path normal-mode kernels (core/kernels/ht/proxy/*.cu), for tests.

It reads the very parameter structs the engine packs (names from kernel_abi_internode.h), follows
the kernels' protocol step for step -- meta records and fences, per (peer, channel) ring streams,
staged rounds, one ordered Write per round, credits -- and pushes the same commands through the
rank's real proxy, so a test runs uccl_ep.cuda.ht_proxy end to end on CPU tensors and compares
with uccl_ep.refs. Warps are not modelled: each stream is one cooperative generator, all of a
launch's streams are interleaved until done (as the kernel's co-resident blocks are).

What it cannot show: that the CUDA code does the same. It is the executable reading of the
kernels' comments; core/tests/gpu/test_cuda_ht_internode.py checks the kernels themselves.
"""

from __future__ import annotations

import ctypes
import struct
import time

import numpy as np
import torch

from uccl_ep.cuda import ht_proxy_plan as plan
from uccl_ep.cuda import runtime
from uccl_ep.proxy import native

C = native()


def mem(addr: int, nbytes: int, dtype=np.uint8) -> np.ndarray:
    """Writable numpy view of [addr, addr + nbytes)."""
    if nbytes == 0:
        return np.zeros(0, dtype=dtype)
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))
    return raw.view(dtype)


def unpack(struct_name: str, params: bytes) -> dict:
    """The fields of a packed params struct by name. The ring geometry members read flat, as the
    kernels' RingArgs take them (internode_ring.cuh ring_args / nvl_ring_args): ``ring.msg_bytes``
    as ``msg_bytes``, ``nvl_ring.msg_bytes`` as ``nvl_msg_bytes``."""
    fields = runtime._abi_structs()[struct_name]
    fmt = "<" + "".join("Q" if t == "uint64_t" else "q" for t, _ in fields)
    flat = {"ring": "", "nvl_ring": "nvl_"}
    names = [flat[f.split(".")[0]] + f.split(".")[1] if "." in f else f for _, f in fields]
    return dict(zip(names, struct.unpack(fmt, params)))


def credit_batch(p: dict) -> int:
    """Messages a receiver consumes before it returns their credits (internode_ring.cuh credit_batch):
    a sender's round, at most half a ring."""
    return max(1, min(p["ring_slots"] // 2, p["chunk"]))


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


class DispatchIO:
    """numpy views of a dispatch kernel's inputs and outputs, and the packed row moved between them:
    x | scales | top-k ids | weights | source index [| source rank | NVL mask] (HTDispatchMsg)."""

    def __init__(self, p: dict) -> None:
        T, K, ns, hb, R = (p[k] for k in ("num_tokens", "num_topk", "num_scales", "hidden_bytes", "num_ranks"))
        self.p, self.K, self.ns, self.hb = p, K, ns, hb
        self.off_s, self.off_k, self.off_w, self.off_src = hb, hb + 4 * ns, hb + 4 * ns + 8 * K, hb + 4 * ns + 12 * K
        self.x = mem(p["x"], T * hb).reshape(T, hb)
        self.in_rank = mem(p["is_token_in_rank"], T * R).reshape(T, R).astype(bool)
        self.scales = mem(p["x_scales"], 4 * ((T - 1) * p["scale_stride_token"] + (ns - 1) * p["scale_stride_col"] + 1),
                          np.uint32) if ns and T else None
        self.topk = mem(p["topk_idx"], 8 * T * K, np.int64).reshape(T, K) if K else None
        self.tw = mem(p["topk_weights"], 4 * T * K, np.uint32).reshape(T, K) if K else None
        rows = self.rows = p["num_rows"]
        self.rx = mem(p["recv_x"], rows * hb).reshape(rows, hb)
        self.rsc = mem(p["recv_scales"], 4 * rows * ns, np.uint32).reshape(rows, ns) if ns else None
        self.ridx = mem(p["recv_topk_idx"], 8 * rows * K, np.int64).reshape(rows, K) if p["recv_topk_idx"] else None
        self.rw = mem(p["recv_topk_weights"], 4 * rows * K, np.uint32).reshape(rows, K) if p["recv_topk_idx"] else None
        self.rsrc = mem(p["recv_src_idx"], 4 * rows, np.int32) if p["recv_src_idx"] else None
        self.rmask = mem(p["recv_mask"], 4 * rows, np.int32) if p.get("recv_mask") else None
        self.E_loc = p["num_experts"] // R
        self.lo = p["rank"] * self.E_loc
        real = int(mem(p["recv_end"], 4 * R, np.int32)[R - 1])
        if self.ridx is not None:  # rows past the real count (num_worst_tokens)
            self.ridx[real:], self.rw[real:] = -1, 0
        if self.rsrc is not None:
            self.rsrc[real:] = -1

    def stage(self, m: np.ndarray, t: int, *extra: int) -> None:
        p, ns, K = self.p, self.ns, self.K
        m[:self.hb] = self.x[t]
        if ns:
            idx = t * p["scale_stride_token"] + np.arange(ns) * p["scale_stride_col"]
            m[self.off_s:self.off_s + 4 * ns] = self.scales[idx].view(np.uint8)
        if K:
            m[self.off_k:self.off_k + 8 * K] = self.topk[t].view(np.uint8)
            m[self.off_w:self.off_w + 4 * K] = self.tw[t].view(np.uint8)
        m[self.off_src:self.off_src + 4 * (1 + len(extra))] = np.array([t, *extra], np.int32).view(np.uint8)

    def field(self, m: np.ndarray, i: int) -> int:
        """int32 field i after the source index (0: source rank, 1: NVL mask)."""
        at = self.off_src + 4 * (1 + i)
        return int(m[at:at + 4].copy().view(np.int32)[0])

    def place(self, m: np.ndarray, row: int) -> None:
        if row >= self.rows:
            return  # more than num_worst_tokens rows: notify reported it
        K, ns = self.K, self.ns
        self.rx[row] = m[:self.hb]
        if ns:
            self.rsc[row] = m[self.off_s:self.off_s + 4 * ns].view(np.uint32)
        if self.ridx is not None:
            g = m[self.off_k:self.off_k + 8 * K].copy().view(np.int64)
            local = (g >= self.lo) & (g < self.lo + self.E_loc)
            self.ridx[row] = np.where(local, g - self.lo, -1)
            self.rw[row] = np.where(local, m[self.off_w:self.off_w + 4 * K].copy().view(np.uint32), 0)
        if self.rsrc is not None:
            self.rsrc[row] = m[self.off_src:self.off_src + 4].copy().view(np.int32)[0]
        if self.rmask is not None:
            self.rmask[row] = self.field(m, 1)


class State:
    """numpy views of HTProxyState."""

    def __init__(self, addr: int) -> None:
        off = plan.state_offsets()
        R, Rg = plan.MAX_RANKS, plan.MAX_RINGS
        self.op = mem(addr + off["op"], 4, np.uint32)
        self.seen = mem(addr + off["seen"], 16 * R, np.int64).reshape(2, R)
        self.send_pos = mem(addr + off["send_pos"], 8 * R * Rg, np.uint64).reshape(R, Rg)   # [peer][ring id]
        self.recv_pos = mem(addr + off["recv_pos"], 8 * R * Rg, np.uint64).reshape(R, Rg)
        self.self_tail = mem(addr + off["self_tail"], 8 * Rg, np.uint64)   # [ring id]: the own stream's TAIL
        self.self_head = mem(addr + off["self_head"], 8 * Rg, np.uint64)   # and its HEAD (device words)
        self.area_geometry = mem(addr + off["area_geometry"], 16, np.uint64)  # per area, since the last handshake


class DmaRole:
    """The copy role of a launch (device/ht_dma.cuh, dma_ring.h): the pushed-byte counts of its
    senders, and the descriptors of every proxy thread's copy ring copied in ring order with `done`
    published, until the senders are done and the descriptors cover the bytes they pushed (a skip
    descriptor, dst 0, counts its bytes and copies nothing). Units and warps are not modelled (each
    descriptor is one copy); the host-visible protocol is."""

    def __init__(self, p: dict) -> None:
        ctx = mem(p["dma"], 128, np.uint64)
        self.n = int(ctx[10])
        self.table = mem(int(ctx[0]), 8 * self.n, np.uint64)
        self.pushed = mem(int(ctx[1]), 8 * self.n, np.uint64)
        self.states = [mem(int(ctx[2]) + 128 * g, 128, np.uint64) for g in range(self.n)]
        self.signals = mem(int(ctx[7]), 8, np.uint64)
        assert p["dma_blocks"] > 0 and p["dma_blocks"] % self.n == 0, "copy blocks are whole groups per ring"
        self.expected = p["dma_senders"]

    def count(self, fifo: int, nbytes: int) -> None:
        if nbytes:
            self.pushed[fifo % self.n] += np.uint64(nbytes)

    def signal(self, k: int = 1) -> None:
        self.signals[0] += np.uint64(k)

    def run(self):
        """Generator: True on progress; ends when every ring's work of this launch is copied."""
        from uccl_ep.cuda.ht_proxy import DMA_RING_CAPACITY as cap
        idx = [int(st[0]) for st in self.states]
        got = [int(st[1]) for st in self.states]
        rings = [int(t) for t in self.table]
        tag_shift, field = 57, (1 << 57) - 1
        while True:
            progress, finished = False, 0
            known = int(self.signals[0]) >= self.expected
            for g in range(self.n):
                target = int(self.pushed[g]) if known else None
                if target is not None and got[g] >= target:
                    assert got[g] == target, f"ring {g}: copied {got[g]} bytes, senders pushed {target}"
                    finished += 1
                    continue
                slot = mem(rings[g] + 64 + 32 * (idx[g] % cap), 32, np.uint64)
                if int(slot[3]) != idx[g] + 1:
                    continue
                tag = ((idx[g] // cap + 1) & 0x7F) << tag_shift
                dst, src, n = (int(w) for w in slot[:3])
                assert dst & ~field == src & ~field == n & ~field == tag, "descriptor lap tags"
                dst, src, n = dst & field, src & field, n & field
                if dst != 0:
                    ctypes.memmove(dst, src, n)
                idx[g] += 1
                got[g] += n
                mem(rings[g], 8, np.uint64)[0] = idx[g]  # header.done
                progress = True
            if finished == self.n:
                break
            yield progress
        for g, st in enumerate(self.states):
            st[0], st[1] = idx[g], got[g]
        self.signals[0] = 0


class _Kernels:
    """The launches of one rank against its proxy, one rank per node (see Emulator below)."""

    def __init__(self, proxy, timeout_s: float = 60.0) -> None:
        self.proxy, self.timeout_s = proxy, timeout_s
        self.launches: list[tuple[str, dict]] = []
        self.skipped_handshakes = 0

    # -- plumbing ------------------------------------------------------------------------------
    def launch(self, name: str, grid, block: int, params: bytes, smem: int = 0) -> None:
        struct_name = {"ht_layout": "HTLayoutParams", "ht_proxy_notify": "HTProxyNotifyParams",
                       "ht_proxy_dispatch": "HTProxyDispatchParams", "ht_proxy_combine": "HTProxyCombineParams",
                       "ht_proxy_forward_dispatch": "HTProxyForwardDispatchParams",
                       "ht_proxy_forward_combine": "HTProxyForwardCombineParams",
                       "ht_proxy_plan_send": "HTProxyPlanSendParams", "ht_proxy_plan_recv": "HTProxyPlanRecvParams",
                       "ht_proxy_forward_handle": "HTProxyForwardHandleParams"}[name]
        p = unpack(struct_name, params)
        self.launches.append((name, dict(p, grid=grid, block=block)))
        self.dma = DmaRole(p) if p.get("dma_blocks", 0) > 0 else None
        getattr(self, name)(p)

    def _push_write(self, fifo: int, cmd, nbytes: int) -> None:
        """A Write with bytes, counted for the launch's copy role first (dma_count_push)."""
        if self.dma is not None:
            self.dma.count(fifo, nbytes)
        self.proxy.push(fifo, *cmd, 10.0)

    def _check_proxy_words(self, p: dict) -> None:
        assert p["region"] == C.proxy_region_address(self.proxy), "region is not the proxy's"
        assert p["num_fifos"] == self.proxy.num_fifos
        addr, nbytes = C.proxy_counters_address(self.proxy)
        assert p["counters"] == addr and nbytes == p["num_ranks"] * p["num_counters"] * 8

    def _run(self, gens, phase: str) -> None:
        live = list(gens)
        role = None
        if self.dma is not None:  # each emulated stream stands for the warps that push for it
            self.dma.expected = len(live)
            role = self.dma.run()
        deadline = time.monotonic() + self.timeout_s
        while live or role is not None:
            progress, keep = False, []
            for g in live:
                try:
                    progress |= next(g)
                    keep.append(g)
                except StopIteration:
                    progress = True
                    if self.dma is not None:
                        self.dma.signal()  # the stream's pushes are all made
            live = keep
            if role is not None:
                try:
                    progress |= next(role)
                except StopIteration:
                    role, progress = None, True
            if not progress:
                self.proxy.raise_if_failed()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"emulated {phase}: {len(live)} streams still waiting")
                time.sleep(0.0002)

    # -- layout.cu ---------------------------------------------------------------------------------
    def ht_layout(self, p: dict) -> None:
        T, K, E, R = p["num_tokens"], p["num_topk"], p["num_experts"], p["num_ranks"]
        topk = mem(p["topk_idx"], 8 * T * K, np.int64).reshape(T, K)
        valid = (topk >= 0) & (topk < E)
        np.add.at(mem(p["num_tokens_per_expert"], 4 * E, np.int32), topk[valid], 1)
        in_rank = np.zeros((T, R), dtype=bool)
        rows, cols = np.nonzero(valid)
        in_rank[rows, topk[rows, cols] // (E // R)] = True
        mem(p["is_token_in_rank"], T * R, np.uint8)[:] = in_rank.reshape(-1)
        mem(p["num_tokens_per_rank"], 4 * R, np.int32)[:] += in_rank.sum(0).astype(np.int32)

    # -- ht/proxy/notify.cu -----------------------------------------------------------------------
    def ht_proxy_notify(self, p: dict) -> None:
        self._check_proxy_words(p)
        R, me, L, hs = p["num_ranks"], p["rank"], p["record_ints"], bool(p["handshake"])
        st = State(p["state"])
        geometry = [p["area_geometry0"], p["area_geometry1"]]
        # the handshake only where an area would change geometry (notify.cu's NOTES)
        changed = any(g and st.area_geometry[a] and int(st.area_geometry[a]) != g for a, g in enumerate(geometry))
        if hs and not changed:
            for a, g in enumerate(geometry):
                if g:
                    st.area_geometry[a] = g
            self.skipped_handshakes += 1
            return
        par = int(st.op[0]) & 1
        counter = plan.META_COUNTER0 + par
        region, base, slot = p["region"], p["meta_base"], p["meta_slot_bytes"]
        f = counter % p["num_fifos"]
        if not hs:
            per_dst = mem(p["per_dst"], 8 * R * L, np.int64).reshape(R, L)
            for d in range(R):
                mem(region + base + ((2 + par) * R + d) * slot, 8 * L, np.int64)[:] = per_dst[d]
        for d in range(R):
            if not hs:
                self._push_write(f, C.encode_counted_write(d, base + ((2 + par) * R + d) * slot,
                                                           base + (par * R + me) * slot, 8 * L, counter), 8 * L)
            self.proxy.push(f, *C.encode_atomic(d, counter, 1 if hs else 2, True), 10.0)

        def arrivals():
            for s in range(R):
                target = int(st.seen[par, s]) + (1 if hs else 2)
                while self.proxy.counter(s, counter) < target:
                    yield False
                st.seen[par, s] = target
            yield True
        assert self.dma is None or p["dma_senders"] == 1, "the notify block signals once, after its pushes"
        self._run([arrivals()], "ht_proxy_notify")
        if not hs:
            out = mem(p["meta_out"], 8 * R * L, np.int64).reshape(R, L)
            for s in range(R):
                out[s] = mem(region + base + (par * R + s) * slot, 8 * L, np.int64)
            if p["check_col"] >= 0:
                bad = np.nonzero(out[:, p["check_col"]] != per_dst[0, p["check_col"]])[0]
                assert bad.size == 0, f"ranks {bad.tolist()} use another message size"
            E_loc = p["num_local_experts"]
            host = mem(p["host"], 4 * (3 + R + E_loc), np.int32)
            a = p["expert_alignment"]
            sums = out[:, p["expert_col"]:p["expert_col"] + E_loc].sum(0)
            host[2 + R:2 + R + E_loc] = (sums + a - 1) // a * a
            host[2:2 + R] = out[:, me]
            rows = int(out[:, me].sum())
            rdma_rows = 0
            if p["node_col"] >= 0:  # as its node's forwarder: from every rail source
                G, nc = p["ranks_per_node"], p["node_col"]
                rdma_rows = int(out[me % G::G, nc:nc + p["num_channels"]].sum())
            host[2 + R + E_loc] = rdma_rows
            assert not (p["num_worst_tokens"] > 0 and max(rows, rdma_rows) > p["num_worst_tokens"]), \
                "num_worst_tokens exceeded"
            host[1] = rows
            host[0] = p["host_tag"]
        st.op[0] += 1
        st.area_geometry[:] = geometry  # every peer started this op: every earlier op's rings were read

    # -- the ring streams (device/internode_ring.cuh) ----------------------------------------------
    # The stream to the rank itself never enters the proxy: it is staged into the own receive ring
    # and counted in HTProxyState's self_tail / self_head (staging_slot, wait_tail, return_credit).
    def _tail(self, p, st, src, ring) -> int:
        return int(st.self_tail[ring]) if src == p["rank"] else self.proxy.counter(src, ring)

    def _credit(self, p, st, src, ring, consumed: int, n: int) -> None:
        if src == p["rank"]:
            st.self_head[ring] = consumed
        else:
            self.proxy.push(ring % p["num_fifos"], *C.encode_atomic(src, p["head_base"] + ring, n, False), 10.0)

    def _send(self, p, st, dst, c, n, stage, hooks=None):
        S, msg, ring = p["ring_slots"], p["msg_bytes"], p["first_ring"] + c
        base = int(st.send_pos[dst, ring])
        credit, k0 = 0, 0
        while k0 < n:
            pos = base + k0
            while pos - credit >= S:
                credit = int(st.self_head[ring]) if dst == p["rank"] else self.proxy.counter(dst, p["head_base"] + ring)
                if pos - credit >= S:
                    yield False
            k1 = k0 + min(n - k0, p["chunk"], S - pos % S, S - (pos - credit),
                          hooks.max_round if hooks else n)
            if hooks:
                yield from hooks.prepare(k0, k1, base)
            stage(k0, k1, base)
            slot0 = pos % S
            if dst == p["rank"]:
                st.self_tail[ring] = base + k1
            else:
                src = plan_slot(p["send_base"], ring_row(p, dst), c, p["num_channels"], S, slot0, msg)
                to = plan_slot(p["recv_base"], ring_row(p, p["rank"]), c, p["num_channels"], S, slot0, msg)
                self._push_write(ring % p["num_fifos"],
                                 C.encode_ordered_write(dst, src, to, (k1 - k0) * msg, ring, k1 - k0), (k1 - k0) * msg)
            if hooks:
                hooks.finish(k0, k1, base)
            k0 = k1
            yield True
        if n:
            st.send_pos[dst, ring] = base + n

    def _recv(self, p, st, src, c, n, consume, hooks=None):
        S, ring = p["ring_slots"], p["first_ring"] + c
        base = int(st.recv_pos[src, ring])
        tail, credited, k0, lazy = 0, base, 0, credit_batch(p)
        while k0 < n:
            pos = base + k0
            while tail <= pos:
                tail = self._tail(p, st, src, ring)
                if tail <= pos:
                    yield False
            k1 = k0 + min(n - k0, tail - pos, hooks.max_round if hooks else n)
            if hooks:
                yield from hooks.prepare(k0, k1, base)
            consume(k0, k1, base)
            if hooks:
                hooks.finish(k0, k1, base)
            consumed = base + k1
            if consumed - credited >= lazy or k1 == n:
                self._credit(p, st, src, ring, consumed, consumed - credited)
                credited = consumed
            k0 = k1
            yield True
        if n:
            st.recv_pos[src, ring] = base + n

    def _slot(self, p, base_key, peer, c, pos) -> np.ndarray:
        S, msg = p["ring_slots"], p["msg_bytes"]
        if base_key == "send_base" and peer == p["rank"]:  # the own stream stages into its receive ring
            base_key = "recv_base"
        return mem(p["region"] + plan_slot(p[base_key], ring_row(p, peer), c, p["num_channels"], S, pos % S, msg), msg)

    # -- ht/proxy/dispatch.cu ---------------------------------------------------------------------
    def ht_proxy_dispatch(self, p: dict) -> None:
        self._check_proxy_words(p)
        R, Cn, T, K, ns, hb = (p[k] for k in ("num_ranks", "num_channels", "num_tokens", "num_topk", "num_scales",
                                              "hidden_bytes"))
        assert plan.dispatch_msg_bytes(hb, ns, K) == p["msg_bytes"]
        st, io = State(p["state"]), DispatchIO(p)
        send_prefix = mem(p["send_prefix"], 4 * R * Cn, np.int32).reshape(R, Cn)
        recv_prefix = mem(p["recv_prefix"], 4 * R * Cn, np.int32).reshape(R, Cn)
        recv_end = mem(p["recv_end"], 4 * R, np.int32)
        per = (T + Cn - 1) // Cn

        def stager(j, c):
            toks = [t for t in range(min(T, c * per), min(T, c * per + per)) if io.in_rank[t, j]]

            def stage(k0, k1, base):
                for k in range(k0, k1):
                    io.stage(self._slot(p, "send_base", j, c, base + k), toks[k])
            return stage

        def consumer(i, c, start):
            def consume(k0, k1, base):
                for k in range(k0, k1):
                    io.place(self._slot(p, "recv_base", i, c, base + k), start + k)
            return consume

        gens = []
        for c in range(Cn):
            for j in range(R):
                n = int(send_prefix[j, c]) - (int(send_prefix[j, c - 1]) if c else 0)
                gens.append(self._send(p, st, j, c, n, stager(j, c)))
            for i in range(R):
                start = int(recv_prefix[i, c])
                end = int(recv_prefix[i, c + 1]) if c + 1 < Cn else int(recv_end[i])
                gens.append(self._recv(p, st, i, c, end - start, consumer(i, c, start)))
        self._run(gens, "ht_proxy_dispatch")

    # -- ht/proxy/combine.cu ----------------------------------------------------------------------
    def ht_proxy_combine(self, p: dict) -> None:
        self._check_proxy_words(p)
        R, Cn, T, H, K = (p[k] for k in ("num_ranks", "num_channels", "num_tokens", "hidden", "num_topk"))
        assert plan.combine_msg_bytes(H, K) == p["msg_bytes"]
        st = State(p["state"])
        recv_prefix = mem(p["recv_prefix"], 4 * R * Cn, np.int32).reshape(R, Cn)
        recv_end = mem(p["recv_end"], 4 * R, np.int32)
        send_prefix = mem(p["send_prefix"], 4 * R * Cn, np.int32).reshape(R, Cn)
        in_rank = mem(p["is_token_in_rank"], T * R).reshape(T, R).astype(bool)
        head = mem(p["send_head"], 4 * T * R, np.int32).reshape(T, R)
        rows_total = int(recv_end[R - 1]) if R else 0
        xs = mem(p["x"], 2 * H * max(rows_total, 1), np.uint16).reshape(-1, H)
        w = mem(p["topk_weights"], 4 * K * max(rows_total, 1), np.uint32).reshape(-1, K) if p["topk_weights"] else None
        out = mem(p["out"], 2 * T * H, np.uint16).reshape(T, H)
        out_w = mem(p["out_weights"], 4 * T * K, np.float32).reshape(T, K) if p["out_weights"] else None
        biases = [mem(p[b], 2 * T * H, np.uint16).reshape(T, H) if p[b] else None for b in ("bias0", "bias1")]
        S = p["ring_slots"]
        per = (T + Cn - 1) // Cn

        def stager(i, c, start):
            def stage(k0, k1, base):
                for k in range(k0, k1):
                    m = self._slot(p, "send_base", i, c, base + k)
                    m[:2 * H] = xs[start + k].view(np.uint8)
                    if w is not None:
                        m[2 * H:2 * H + 4 * K] = w[start + k].view(np.uint8)
            return stage

        def reducer(c):
            base = [int(st.recv_pos[j, p["first_ring"] + c]) for j in range(R)]
            tail = [0] * R
            consumed, credited = [0] * R, [0] * R
            B = max(1, min(16, S // 2))
            lazy = credit_batch(p)
            t0, t1 = min(T, c * per), min(T, c * per + per)
            for tb in range(t0, t1, B):
                for t in range(tb, min(tb + B, t1)):
                    acc = np.zeros(H, np.float32)
                    if biases[0] is not None:
                        acc = _bf16_to_f32(biases[0][t])
                    if biases[1] is not None:
                        acc = (acc + _bf16_to_f32(biases[1][t])).astype(np.float32)
                    acc = (acc + np.float32(0)).astype(np.float32)
                    acc_w = np.zeros(K, np.float32)
                    for j in range(R):
                        if not in_rank[t, j]:
                            continue
                        pos = base[j] + int(head[t, j]) - (int(send_prefix[j, c - 1]) if c else 0)
                        while tail[j] <= pos:
                            tail[j] = self._tail(p, st, j, p["first_ring"] + c)
                            if tail[j] <= pos:
                                yield False
                        m = self._slot(p, "recv_base", j, c, pos)
                        acc = (acc + _bf16_to_f32(m[:2 * H].copy().view(np.uint16))).astype(np.float32)
                        acc_w = (acc_w + m[2 * H:2 * H + 4 * K].copy().view(np.float32)).astype(np.float32)
                    out[t] = torch.from_numpy(acc).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
                    if out_w is not None:
                        out_w[t] = acc_w
                for j in range(R):
                    consumed[j] += int(in_rank[tb:min(tb + B, t1), j].sum())
                    _check_dense(head[t0:min(tb + B, t1), j], in_rank[t0:min(tb + B, t1), j], consumed[j],
                                 int(send_prefix[j, c - 1]) if c else 0)
                    if consumed[j] - credited[j] > 0 and (consumed[j] - credited[j] >= lazy or tb + B >= t1):
                        self._credit(p, st, j, p["first_ring"] + c, base[j] + consumed[j], consumed[j] - credited[j])
                        credited[j] = consumed[j]
                yield True
            for j in range(R):
                if consumed[j]:
                    st.recv_pos[j, p["first_ring"] + c] = base[j] + consumed[j]

        gens = []
        for c in range(Cn):
            for i in range(R):
                start = int(recv_prefix[i, c])
                end = int(recv_prefix[i, c + 1]) if c + 1 < Cn else int(recv_end[i])
                gens.append(self._send(p, st, i, c, end - start, stager(i, c, start)))
            gens.append(reducer(c))
        self._run(gens, "ht_proxy_combine")


def _check_dense(heads: np.ndarray, present: np.ndarray, consumed: int, prefix: int) -> None:
    """The kernels' reducer (reduce_rounds) takes a stream as consumed through a round's last message:
    a channel's messages sit at consecutive positions in token order. The count of the channel's
    messages so far must say the same."""
    idx = np.flatnonzero(present)
    if idx.size and int(heads[idx[-1]]) - prefix + 1 != consumed:
        raise AssertionError(f"stream positions not dense: last message at {int(heads[idx[-1]]) - prefix}, "
                             f"{consumed} messages counted")


def plan_slot(base: int, peer: int, c: int, num_rings: int, slots: int, slot: int, msg: int) -> int:
    """ht_ring_slot of kernel_abi_internode.h (``peer``: the row, ring_row)."""
    return base + ((peer * num_rings + c) * slots + slot) * msg


def ring_row(p: dict, peer: int) -> int:
    """The row of peer's rings in the area (HTRingGeometry::peer_div / peer_mod; device ring_row)."""
    return (peer // p["peer_div"]) % p["peer_mod"]


from ht_proxy_emulator_forward import ForwardKernels  # noqa: E402  (it uses the helpers above)
from ht_proxy_emulator_plan import PlanKernels  # noqa: E402


class Emulator(ForwardKernels, PlanKernels, _Kernels):
    """Executes kernel launches of one rank against its proxy (several ranks per node: ForwardKernels;
    a fresh dispatch's plan: PlanKernels)."""
