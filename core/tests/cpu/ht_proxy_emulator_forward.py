"""The emulator's half for several ranks per node (core/kernels/ht/proxy/forward_dispatch.cu,
ht/proxy/forward_combine.cu): hop 1 once per node, the forwarder's own rows and hop-2 copies in
source-major order, hop 2; rows back (hop A), the node's fp32 partials (hop B), the source's reduce.
Same contract as ht_proxy_emulator.py, whose Emulator these methods join."""

from __future__ import annotations

import numpy as np
import torch

from ht_proxy_emulator import C, DispatchIO, State, _bf16_to_f32, _check_dense, mem, plan_slot, ring_row


def _f32_to_bf16(acc: np.ndarray) -> np.ndarray:
    """fp32 -> BF16 bits (round to nearest even, as the kernels' cast)."""
    return torch.from_numpy(np.ascontiguousarray(acc, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
from uccl_ep.cuda import ht_proxy_plan as plan


class ForwardKernels:
    def _views(self, p, names, shapes):
        R, Cn, G = p["num_ranks"], p["num_channels"], p["ranks_per_node"]
        N = R // G
        dims = {"RC": (R, Cn), "NC": (N, Cn), "R": (R,)}
        out = []
        for name, shape in zip(names, shapes):
            n = int(np.prod(dims[shape]))
            out.append(mem(p[name], 4 * n, np.int32).reshape(dims[shape]))
        return out

    def ht_proxy_forward_dispatch(self, p: dict) -> None:
        self._check_proxy_words(p)
        R, Cn, G, T, K, ns, hb = (p[k] for k in ("num_ranks", "num_channels", "ranks_per_node", "num_tokens",
                                                 "num_topk", "num_scales", "hidden_bytes"))
        N, me = R // G, p["rank"]
        me_l, node = me % G, me // G
        msg = plan.forward_msg_bytes(hb, ns, K)
        assert msg == p["msg_bytes"] == p["nvl_msg_bytes"]
        p2 = _nvl(p)
        st, io = State(p["state"]), DispatchIO(p)
        in_rank = io.in_rank
        nsp, rdma_prefix, rdma_count, recv_prefix, recv_end, recv_count = self._views(
            p, ("node_send_prefix", "rdma_prefix", "rdma_count", "recv_prefix", "recv_end", "recv_count"),
            ("NC", "NC", "NC", "RC", "R", "RC"))
        rdma_mask = mem(p["rdma_mask"], 4 * p["rdma_rows"], np.int32) if p["rdma_mask"] else None
        per = (T + Cn - 1) // Cn
        place = io.place

        def node_stager(n, c):
            dst = n * G + me_l
            toks = [t for t in range(min(T, c * per), min(T, c * per + per)) if in_rank[t, n * G:(n + 1) * G].any()]

            def stage(k0, k1, base):
                for k in range(k0, k1):
                    t = toks[k]
                    bits = int((in_rank[t, n * G:(n + 1) * G].astype(np.int64) << np.arange(G)).sum())
                    io.stage(self._slot(p, "send_base", dst, c, base + k), t, me, bits)
            return dst, len(toks), stage

        def forwarder(c):
            S2, ring2 = p2["ring_slots"], p2["first_ring"] + c
            locals_ = [l for l in range(G) if l != me_l]
            pos2 = {l: int(st.send_pos[node * G + l, ring2]) for l in locals_}
            credit2 = {l: 0 for l in locals_}
            cap = min(128, max(1, S2 // 2))
            for mnode in range(N):
                src = mnode * G + me_l
                rdma_start, self_start = int(rdma_prefix[mnode, c]), int(recv_prefix[src, c])
                run = {"self": 0}
                rnd = {}

                class Hooks:
                    max_round = cap

                    @staticmethod
                    def prepare(k0, k1, base):
                        masks = [io.field(self._slot(p, "recv_base", src, c, base + k), 1) for k in range(k0, k1)]
                        cnt = _round_layout(rnd, masks, k0, me_l, locals_, run)
                        for l in locals_:
                            need = pos2[l] + cnt[l] - S2
                            while cnt[l] and credit2[l] < need:
                                credit2[l] = self.proxy.counter(node * G + l, p["head_base"] + ring2)
                                if credit2[l] < need:
                                    yield False

                    @staticmethod
                    def finish(k0, k1, base):
                        for l in locals_:
                            pos, left = pos2[l], rnd["cnt"][l]
                            while left:
                                run_ = min(left, S2 - pos % S2)
                                slot0 = pos % S2
                                f = plan_slot(p2["send_base"], ring_row(p2, node * G + l), c, Cn, S2, slot0, msg)
                                t = plan_slot(p2["recv_base"], ring_row(p2, me), c, Cn, S2, slot0, msg)
                                self._push_write(ring2 % p["num_fifos"], C.encode_ordered_write(
                                    node * G + l, f, t, run_ * msg, ring2, run_), run_ * msg)
                                pos, left = pos + run_, left - run_
                            pos2[l] = pos

                def consume(k0, k1, base):
                    for k in range(k0, k1):
                        m = self._slot(p, "recv_base", src, c, base + k)
                        mask, selfi, pos = rnd[k]
                        if rdma_mask is not None and rdma_start + k < p["rdma_rows"]:
                            rdma_mask[rdma_start + k] = mask
                        if selfi is not None:
                            place(m, self_start + selfi)
                        for l, q in pos.items():
                            self._slot(p2, "send_base", node * G + l, c, pos2[l] + q)[:] = m

                yield from self._recv(p, st, src, c, int(rdma_count[mnode, c]), consume, Hooks)
            for l in locals_:
                st.send_pos[node * G + l, ring2] = pos2[l]

        def hop2(f_local, c):
            f = node * G + f_local
            n = int(recv_count[f_local::G, c].sum())

            def consume(k0, k1, base):
                for k in range(k0, k1):
                    m = self._slot(p2, "recv_base", f, c, base + k)
                    s_ = io.field(m, 0)
                    assert s_ % G == f_local, "a source this forwarder does not serve"
                    before = int(recv_count[f_local:s_:G, c].sum())
                    place(m, int(recv_prefix[s_, c]) + k - before)
            return self._recv(p2, st, f, c, n, consume)

        gens = []
        for c in range(Cn):
            for n in range(N):
                dst, cnt, stage = node_stager(n, c)
                gens.append(self._send(p, st, dst, c, cnt, stage))
            gens.append(forwarder(c))
            for l in range(G):
                if l != me_l:
                    gens.append(hop2(l, c))
        self._run(gens, "ht_proxy_forward_dispatch")

    def ht_proxy_forward_combine(self, p: dict) -> None:
        self._check_proxy_words(p)
        R, Cn, G, T, H, K = (p[k] for k in ("num_ranks", "num_channels", "ranks_per_node", "num_tokens", "hidden",
                                            "num_topk"))
        N, me = R // G, p["rank"]
        me_l, node = me % G, me // G
        bf16 = bool(p["partial_bf16"])  # hop B in BF16 (Tuning.ht_partials_bf16), else fp32
        assert plan.partial_msg_bytes(H, K, bf16) == p["msg_bytes"] and plan.combine_msg_bytes(H, K) == p["nvl_msg_bytes"]
        wB = (2 if bf16 else 4) * H  # where a partial's weights start
        pA = _nvl(p)
        st = State(p["state"])
        nsp, rdma_prefix, rdma_count, recv_prefix, recv_end, recv_count = self._views(
            p, ("node_send_prefix", "rdma_prefix", "rdma_count", "recv_prefix", "recv_end", "recv_count"),
            ("NC", "NC", "NC", "RC", "R", "RC"))
        head = mem(p["send_rdma_head"], 4 * T * N, np.int32).reshape(T, N)
        rdma_total = int(rdma_count.sum())
        rdma_mask = mem(p["rdma_mask"], 4 * max(rdma_total, 1), np.int32)
        rows_total = max(int(recv_end[R - 1]), 1)
        xs = mem(p["x"], 2 * H * rows_total, np.uint16).reshape(-1, H)
        w = mem(p["topk_weights"], 4 * K * rows_total, np.float32).reshape(-1, K) if p["topk_weights"] else None
        out = mem(p["out"], 2 * T * H, np.uint16).reshape(T, H)
        out_w = mem(p["out_weights"], 4 * T * K, np.float32).reshape(T, K) if p["out_weights"] else None
        biases = [mem(p[b], 2 * T * H, np.uint16).reshape(T, H) if p[b] else None for b in ("bias0", "bias1")]
        SA, SB = pA["ring_slots"], p["ring_slots"]
        per = (T + Cn - 1) // Cn

        def rows_back(f_local, c):
            f = node * G + f_local
            srcs = list(range(f_local, R, G))
            n = int(sum(recv_count[s_, c] for s_ in srcs))

            def stage(k0, k1, base):
                for k in range(k0, k1):
                    before = 0
                    for s_ in srcs:
                        if before + recv_count[s_, c] > k:
                            break
                        before += int(recv_count[s_, c])
                    row = int(recv_prefix[s_, c]) + k - before
                    m = self._slot(pA, "send_base", f, c, base + k)
                    m[:2 * H] = xs[row].view(np.uint8)
                    if w is not None:
                        m[2 * H:2 * H + 4 * K] = w[row].view(np.uint8)
            return self._send(pA, st, f, c, n, stage)

        def forwarder(c):
            ringA = pA["first_ring"] + c
            locals_ = [l for l in range(G) if l != me_l]
            posA = {l: int(st.recv_pos[node * G + l, ringA]) for l in locals_}
            tailA = {l: 0 for l in locals_}
            credA = dict(posA)
            lazy = max(1, SA // 2)
            cap = min(128, max(1, SA // 2))
            for mnode in range(N):
                src = mnode * G + me_l
                rdma_start, self_start = int(rdma_prefix[mnode, c]), int(recv_prefix[src, c])
                run = {"self": 0}
                rnd = {}

                class Hooks:
                    max_round = cap

                    @staticmethod
                    def prepare(k0, k1, base):
                        masks = [int(rdma_mask[rdma_start + k]) for k in range(k0, k1)]
                        cnt = _round_layout(rnd, masks, k0, me_l, locals_, run)
                        for l in locals_:
                            while cnt[l] and tailA[l] < posA[l] + cnt[l]:
                                tailA[l] = self.proxy.counter(node * G + l, ringA)
                                if tailA[l] < posA[l] + cnt[l]:
                                    yield False

                    @staticmethod
                    def finish(k0, k1, base):
                        for l in locals_:
                            posA[l] += rnd["cnt"][l]
                            if posA[l] - credA[l] >= lazy:
                                self.proxy.push(ringA % p["num_fifos"], *C.encode_atomic(
                                    node * G + l, p["head_base"] + ringA, posA[l] - credA[l], False), 10.0)
                                credA[l] = posA[l]

                def stage(k0, k1, base):
                    for k in range(k0, k1):
                        mask, selfi, pos = rnd[k]
                        acc, acc_w = np.zeros(H, np.float32), np.zeros(K, np.float32)
                        for l in range(G):  # local ranks ascending
                            if not (mask >> l) & 1:
                                continue
                            if l == me_l:
                                row, wt = xs[self_start + selfi], (w[self_start + selfi] if w is not None else None)
                            else:
                                m = self._slot(pA, "recv_base", node * G + l, c, posA[l] + pos[l])
                                row = m[:2 * H].copy().view(np.uint16)
                                wt = m[2 * H:2 * H + 4 * K].copy().view(np.float32)
                            acc = (acc + _bf16_to_f32(row)).astype(np.float32)
                            if K:
                                acc_w = (acc_w + wt).astype(np.float32)
                        mB = self._slot(p, "send_base", src, c, base + k)
                        mB[:wB] = (_f32_to_bf16(acc) if bf16 else acc).view(np.uint8)
                        mB[wB:wB + 4 * K] = acc_w.view(np.uint8)

                yield from self._send(p, st, src, c, int(rdma_count[mnode, c]), stage, Hooks)
            for l in locals_:
                if posA[l] > credA[l]:
                    self.proxy.push(ringA % p["num_fifos"], *C.encode_atomic(
                        node * G + l, p["head_base"] + ringA, posA[l] - credA[l], False), 10.0)
                st.recv_pos[node * G + l, ringA] = posA[l]

        def reducer(c):
            ring = p["first_ring"] + c
            rails = [n * G + me_l for n in range(N)]
            base = [int(st.recv_pos[r_, ring]) for r_ in rails]
            tail, consumed, credited = [0] * N, [0] * N, [0] * N
            B, lazy = max(1, min(16, SB // 2)), max(1, SB // 2)
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
                    for n in range(N):  # nodes ascending
                        if head[t, n] < 0:
                            continue
                        pos = base[n] + int(head[t, n]) - (int(nsp[n, c - 1]) if c else 0)
                        while tail[n] <= pos:
                            tail[n] = self._tail(p, st, rails[n], ring)
                            if tail[n] <= pos:
                                yield False
                        m = self._slot(p, "recv_base", rails[n], c, pos)
                        part = _bf16_to_f32(m[:wB].copy().view(np.uint16)) if bf16 else m[:wB].copy().view(np.float32)
                        acc = (acc + part).astype(np.float32)
                        acc_w = (acc_w + m[wB:wB + 4 * K].copy().view(np.float32)).astype(np.float32)
                    out[t] = _f32_to_bf16(acc)
                    if out_w is not None:
                        out_w[t] = acc_w
                for n in range(N):
                    consumed[n] += int((head[tb:min(tb + B, t1), n] >= 0).sum())
                    _check_dense(head[t0:min(tb + B, t1), n], head[t0:min(tb + B, t1), n] >= 0, consumed[n],
                                 int(nsp[n, c - 1]) if c else 0)
                    if consumed[n] - credited[n] > 0 and (consumed[n] - credited[n] >= lazy or tb + B >= t1):
                        self._credit(p, st, rails[n], ring, base[n] + consumed[n], consumed[n] - credited[n])
                        credited[n] = consumed[n]
                yield True
            for n in range(N):
                if consumed[n]:
                    st.recv_pos[rails[n], ring] = base[n] + consumed[n]

        gens = []
        for c in range(Cn):
            for l in range(G):
                if l != me_l:
                    gens.append(rows_back(l, c))
            gens.append(forwarder(c))
            gens.append(reducer(c))
        self._run(gens, "ht_proxy_forward_combine")


def _round_layout(rnd: dict, masks, k0: int, me_l: int, locals_: list, run: dict) -> dict:
    """A forwarder round (ForwardShared / PartialShared of the kernels): per message its mask, its
    own-row offset (running per source) and its position in every other local rank's stream;
    returns the messages per local rank."""
    rnd.clear()
    cnt = {l: 0 for l in locals_}
    for i, mask in enumerate(masks):
        selfi = None
        if (mask >> me_l) & 1:
            selfi, run["self"] = run["self"], run["self"] + 1
        pos = {}
        for l in locals_:
            if (mask >> l) & 1:
                pos[l], cnt[l] = cnt[l], cnt[l] + 1
        rnd[k0 + i] = (mask, selfi, pos)
    rnd["cnt"] = cnt
    return cnt


def _nvl(p: dict) -> dict:
    """The area-1 (hop 2 / hop A) geometry of a forward kernel's params, under the plain names."""
    return dict(p, **{k: p["nvl_" + k] for k in ("msg_bytes", "ring_slots", "chunk", "recv_base", "send_base",
                                                 "first_ring", "peer_div", "peer_mod")})

