"""Ring depth and credit cadence of normal mode through the proxy with one rank per node
(uccl_ep/cuda/ht_proxy.py, device/internode_ring.cuh), on CPU: what a stream can keep in flight.

- Without forwarding only area 0 carries rings, so it gets the whole region: at the bench's shape
  (2 ranks as 2 nodes, 7168 hidden, 24 SMs, DeepEP's config table, the NVL size hint) BF16 dispatch
  and combine rings are as deep as config.num_max_rdma_chunked_recv_tokens asks (132 messages)
  instead of the 72 half the region held; with forwarding (two hops) the areas stay two.
- A receiver returns credits once a sender's round is consumed (credit_batch: `chunk`, at most half
  a ring), not once half a ring is, so the sender's window stays near the whole ring.
Correctness of both through the emulated kernels, bitwise against uccl_ep.refs:
test_ht_internode_proxy_path.py (end-to-end cases with 8-slot rings, every stream wrapping).
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ht_proxy_emulator import _Kernels as Kernels, credit_batch  # noqa: E402
from uccl_ep import Buffer  # noqa: E402
from uccl_ep.cuda import ht_proxy  # noqa: E402
from uccl_ep.cuda import ht_proxy_plan as plan  # noqa: E402

pytestmark = pytest.mark.cpu
H, R = 7168, 2


def _engine_like(forward: bool, config):
    nvl = config.get_nvl_buffer_size_hint(H * 2, R)
    shared, _ = plan.region_layout(nvl, R)
    return SimpleNamespace(R=R, G=2 if forward else 1, shared=shared, forward=forward, num_counters=6144, num_fifos=8,
                           ec=SimpleNamespace(ctx=SimpleNamespace(timeout_s=60.0), timeout_ns=1))


@pytest.mark.parametrize("msg", [plan.dispatch_msg_bytes(2 * H, 0, 8), plan.dispatch_msg_bytes(H, H // 128, 8),
                                 plan.combine_msg_bytes(H, 8)], ids=["bf16", "fp8", "combine"])
def test_one_rank_per_node_rings_take_the_whole_region(msg):
    Buffer.set_num_sms(24)
    config = Buffer.get_dispatch_config(R)
    C = config.num_channels
    one = ht_proxy.ProxyNormalEngine.ring(_engine_like(False, config), msg, C, config, "x")["ring"]
    two = ht_proxy.ProxyNormalEngine.ring(_engine_like(True, config), msg, C, config, "x")["ring"]
    eng = _engine_like(False, config)
    assert one["ring_slots"] == min(config.num_max_rdma_chunked_recv_tokens, eng.shared // (2 * R * C) // msg)
    assert one["ring_slots"] == config.num_max_rdma_chunked_recv_tokens  # the config's depth, not the region's half
    # with forwarding (here 1 node x 2 ranks) area 0 keeps rows for one rank per node, area 1 per node mate
    fwd = _engine_like(True, config)
    assert two["ring_slots"] == min(config.num_max_rdma_chunked_recv_tokens,
                                    eng.shared // 2 // (2 * (R // fwd.G) * C) // msg)
    assert (two["peer_div"], two["peer_mod"], one["peer_div"], one["peer_mod"]) == (fwd.G, R // fwd.G, 1, R)
    mates = ht_proxy.ProxyNormalEngine.ring(fwd, msg, C, config, "x", area=1)["nvl_ring"]
    assert (mates["peer_div"], mates["peer_mod"]) == (1, fwd.G)
    assert mates["ring_slots"] == min(config.num_max_nvl_chunked_recv_tokens, eng.shared // 2 // (2 * fwd.G * C) // msg)
    # both rings of every (peer, channel) fit the region below its meta records
    assert one["send_base"] + R * C * one["ring_slots"] * msg <= eng.shared
    print(f"msg {msg} B: {two['ring_slots']} -> {one['ring_slots']} slots, in flight per stream "
          f"{two['ring_slots'] * msg >> 10} -> {one['ring_slots'] * msg >> 10} KiB, chunk {one['chunk']}")


def _credits(slots: int, chunk: int, n: int) -> list[int]:
    """Credit returns of one emulated receive stream of n messages (all landed at once)."""
    k = Kernels.__new__(Kernels)
    sent = []
    k._tail = lambda p, st, src, ring: 10 ** 9
    k._credit = lambda p, st, src, ring, consumed, n: sent.append(n)
    st = SimpleNamespace(recv_pos=np.zeros((1, 1), dtype=np.int64))
    p = dict(ring_slots=slots, chunk=chunk, first_ring=0)
    hooks = SimpleNamespace(max_round=chunk, prepare=lambda *a: iter(()), finish=lambda *a: None)
    for _ in k._recv(p, st, 0, 0, n, lambda *a: None, hooks):
        pass
    return sent


def test_credits_come_back_per_round():
    assert credit_batch(dict(ring_slots=132, chunk=12)) == 12
    assert credit_batch(dict(ring_slots=8, chunk=4)) == 4 and credit_batch(dict(ring_slots=2, chunk=1)) == 1
    assert _credits(132, 12, 264) == [12] * 22  # a credit per round of the sender, not per 66 messages
    assert _credits(8, 4, 10) == [4, 4, 2]      # the last one at the end of the stream


def test_forwarding_rings_at_two_nodes_of_eight():
    """16 ranks as 2 nodes x 8 in the NVL buffer a DeepEP config asks for: hop 1 / hop B rings take 2 rows
    (one per node) instead of 16, hop 2 / hop A 8 (the node's ranks), so both get the config's depth."""
    R16, G = 16, 8
    Buffer.set_num_sms(20)
    config = Buffer.get_combine_config(R16)
    C = config.num_channels
    shared, _ = plan.region_layout(config.get_nvl_buffer_size_hint(H * 2, R16), R16)
    partial = plan.partial_msg_bytes(H, 8)
    rows = plan.geometry(R16, shared, 60.0, partial, C, config, "hop B", area=0, areas=2, ranks_per_node=G)
    every = plan.geometry(R16, shared, 60.0, partial, C, config, "hop B", area=0, areas=2, ranks_per_node=1)
    assert (rows.peer_div, rows.peer_mod, every.peer_mod) == (G, R16 // G, R16)
    assert rows.ring_slots == config.num_max_rdma_chunked_recv_tokens > 4 * every.ring_slots
    mates = plan.geometry(R16, shared, 60.0, plan.combine_msg_bytes(H, 8), C, config, "hop A", area=1, areas=2,
                          ranks_per_node=G)
    assert (mates.peer_div, mates.peer_mod) == (1, G)
    # every row's receive and staging rings fit the area
    for g, n in ((rows, R16 // G), (mates, G)):
        assert g.send_base + n * C * g.ring_slots * g.msg_bytes <= (g.first_ring // C + 1) * (shared // 2 // 16 * 16)
