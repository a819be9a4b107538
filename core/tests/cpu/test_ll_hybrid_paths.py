"""Hybrid low-latency paths of the cuda executor, on CPU: which peer each rank reaches over NVLink and
which through the proxy (uccl_ep.cuda.ll_hybrid.ll_peer_paths after executor.plan_paths), the error
when a node spans hosts, and the kernels' hybrid fields (HybridPeers: the NVLink peers' table, bit
mask and signal words). The traffic itself runs on 4 GPUs: core/tests/gpu/test_cuda_ll_hybrid.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from uccl_ep.cuda import ll_hybrid
from uccl_ep.cuda.executor import plan_paths
from uccl_ep.cuda.ll_hybrid import HybridPeers, ll_peer_paths
from uccl_ep.cuda.ll_proxy import ProxyLayout
from uccl_ep.errors import LimitExceeded, Unsupported
from uccl_ep.topology import Topology

S, N, P = ll_hybrid.SELF, ll_hybrid.NVLINK, ll_hybrid.PROXY


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("UCCL_EP_FORCE_PROXY", "UCCL_EP_TRANSPORT", "UCCL_EP_RANKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)


def _ctx(R, G, nvlink=True):
    return SimpleNamespace(topology=Topology(R, G), low_latency_mode=True, allow_nvlink_for_low_latency_mode=nvlink,
                           num_ranks=R)


def _table(R, G, devices, nvlink=True):
    """Every rank's row of paths, as each rank's executor computes its own."""
    ctx = _ctx(R, G, nvlink)
    _, _, ll_proxy = plan_paths(ctx, devices)
    return ["".join({S: "s", N: "n", P: "p"}[p] for p in ll_peer_paths(r, R, G, ll_proxy, not nvlink))
            for r in range(R)]


def _one_host(R):
    return [("a", d) for d in range(R)]


def test_one_node_is_all_nvlink():
    """ranks_per_node = the group (the default on one host): nothing changes, every peer over NVLink."""
    assert _table(4, 4, _one_host(4)) == ["snnn", "nsnn", "nnsn", "nnns"]
    assert _table(2, 2, _one_host(2)) == ["sn", "ns"]


def test_four_gpus_as_two_nodes_of_two():
    """0<->1 and 2<->3 over NVLink, the rest through the proxy (ipc on one host)."""
    assert _table(4, 2, _one_host(4)) == ["snpp", "nspp", "ppsn", "ppns"]


def test_eight_gpus_as_two_nodes_of_four_and_four_of_two():
    assert _table(8, 4, _one_host(8)) == ["snnnpppp", "nsnnpppp", "nnsnpppp", "nnnspppp",
                                         "ppppsnnn", "ppppnsnn", "ppppnnsn", "ppppnnns"]
    assert _table(8, 2, _one_host(8)) == ["snpppppp", "nspppppp", "ppsnpppp", "ppnspppp",
                                         "ppppsnpp", "ppppnspp", "ppppppsn", "ppppppns"]


def test_one_rank_per_node_is_all_proxy():
    assert _table(4, 1, _one_host(4)) == ["sppp", "pspp", "ppsp", "ppps"]


def test_forced_proxy_sends_every_peer_through_the_proxy():
    """allow_nvlink_for_low_latency_mode=False: DeepEP's meaning, every peer through the network path,
    one node or several."""
    for G in (4, 2, 1):
        assert _table(4, G, _one_host(4), nvlink=False) == ["sppp", "pspp", "ppsp", "ppps"]


def test_forced_by_env(monkeypatch):
    monkeypatch.setenv("UCCL_EP_FORCE_PROXY", "1")
    ctx = _ctx(4, 2)
    from uccl_ep.cuda.ll_proxy import proxy_forced
    assert proxy_forced(ctx)
    assert ll_peer_paths(0, 4, 2, True, proxy_forced(ctx)) == (S, P, P, P)


def test_two_hosts_nodes_of_two():
    """Nodes of the hosts' ranks: a host's peers over NVLink, the other host's through the proxy."""
    two_hosts = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert _table(4, 2, two_hosts) == ["snpp", "nspp", "ppsn", "ppns"]
    assert _table(4, 1, two_hosts) == ["sppp", "pspp", "ppsp", "ppps"]   # nodes of one rank inside hosts


def test_nodes_that_span_hosts_are_refused():
    with pytest.raises(Unsupported, match="must share a host"):
        _table(4, 4, [("a", 0), ("a", 1), ("b", 0), ("b", 1)])   # one node over two hosts
    with pytest.raises(Unsupported, match="must share a host"):
        _table(4, 2, [("a", 0), ("b", 0), ("a", 1), ("b", 1)])   # interleaved hosts


class _Mem:
    """Device memory the test can read (HybridPeers' peer table)."""
    made: list = []

    def __init__(self, dev, nbytes):
        self.ptr, self.nbytes, self.freed = 0x1000 * (len(_Mem.made) + 1), nbytes, False
        _Mem.made.append(self)

    def free(self):
        self.freed = True


class _Drv:
    def __init__(self):
        self.copies, self.sets = {}, []

    def memcpy_htod(self, dev, ptr, blob):
        self.copies[ptr] = bytes(blob)

    def memset_d8(self, dev, ptr, value, nbytes, stream):
        self.sets.append((ptr, value, nbytes))


def test_hybrid_fields_of_the_kernels(monkeypatch):
    import struct
    monkeypatch.setattr(ll_hybrid, "DeviceMemory", _Mem)
    _Mem.made = []
    drv = _Drv()
    R = 4
    paths = ll_peer_paths(2, R, 2, True, False)   # rank 2 of 2 nodes x 2: rank 3 over NVLink
    bases = [0xA000, 0, 0xC000, 0xD000]           # the executor's maps: own buffer, NVLink peer 3
    h = HybridPeers(0, drv, paths, bases)
    assert h.peers == (3,) and h.mask == 1 << 3
    assert struct.unpack("<4Q", drv.copies[h.table.ptr]) == (0, 0, 0, 0xD000)   # only NVLink peers mapped
    lay = ProxyLayout.make(64, 2048, 32, R)
    for s in (0, 1):
        for phase in (0, 1):
            off = 2 * lay.set_bytes + (2 * s + phase) * 8 * R   # after both sets, u64 [2][2][R]
            assert h.send_fields(lay, s, phase) == dict(peer_ll=h.table.ptr, nvl_peers=8, nvl_signal_off=off)
            mem = SimpleNamespace(ptr=0x100000)
            assert h.recv_fields(mem, lay, s, phase) == dict(nvl_peers=8, nvl_signal=0x100000 + off)
    h.clean(SimpleNamespace(ptr=0x100000), lay)
    assert drv.sets == [(0x100000 + 2 * lay.set_bytes, 0, 4 * 8 * R)]
    h.check_fits(lay, 2 * lay.set_bytes + 4 * 8 * R)
    with pytest.raises(LimitExceeded, match="num_rdma_bytes"):
        h.check_fits(lay, 2 * lay.set_bytes + 4 * 8 * R - 1)
    h.free()
    assert _Mem.made[0].freed


def test_no_nvlink_peer_changes_nothing(monkeypatch):
    """Forced proxy or one rank per node: the kernels get zero hybrid fields and the layout needs no
    more bytes than the proxy path's."""
    monkeypatch.setattr(ll_hybrid, "DeviceMemory", _Mem)
    _Mem.made = []
    drv = _Drv()
    h = HybridPeers(0, drv, ll_peer_paths(0, 4, 2, True, True), [0, 0, 0, 0])
    lay = ProxyLayout.make(64, 2048, 32, 4)
    assert h.table is None and not _Mem.made
    assert h.send_fields(lay, 1, 1) == dict(peer_ll=0, nvl_peers=0, nvl_signal_off=0)
    assert h.recv_fields(SimpleNamespace(ptr=1), lay, 1, 1) == dict(nvl_peers=0, nvl_signal=0)
    h.check_fits(lay, 2 * lay.set_bytes)
    h.clean(SimpleNamespace(ptr=1), lay)
    assert drv.sets == []


def test_the_size_hint_leaves_room_for_the_signal_words():
    """Buffers sized by get_low_latency_rdma_size_hint hold the hybrid words at the tests' and the
    bench's shapes (2 nodes x 2 and x 4)."""
    from uccl_ep.config import low_latency_rdma_size_hint
    for T, H, E in ((64, 2048, 32), (128, 7168, 288), (128, 7168, 256), (8, 2048, 32)):
        for R in (4, 8):
            lay = ProxyLayout.make(T, H, E, R)
            assert 2 * lay.set_bytes + 4 * 8 * R <= low_latency_rdma_size_hint(T, H, R, E), (T, H, E, R)


def test_executor_maps_only_the_nodes_peers():
    """The LL buffers the executor opens for a hybrid rank: its node's peers only (0 for the others),
    and every peer for the NVLink kernels."""
    from uccl_ep.cuda.executor import CudaExecutor

    class Mem:
        ptr = 0x10
        opened: list = []

        def open_peer(self, h):
            Mem.opened.append(h)
            return 0x1000 + h

    me = SimpleNamespace(ctx=SimpleNamespace(rank=2))
    paths = ll_peer_paths(2, 4, 2, True, False)
    nvl = [r for r, p in enumerate(paths) if p == N]
    assert CudaExecutor._open_peers(me, Mem(), [0, 1, 2, 3], nvl) == [0, 0, 0x10, 0x1003]
    assert Mem.opened == [3]
    Mem.opened = []
    assert CudaExecutor._open_peers(me, Mem(), [0, 1, 2, 3]) == [0x1000, 0x1001, 0x10, 0x1003]
    assert Mem.opened == [0, 1, 3]
