"""Which normal-mode streams go over NVLink: ProxyNormalEngine._map_mates (cuda/ht_proxy.py).

A node's ranks store hop 2 and hop A into each other's rings when every rank of the node sees every
other's GPU and none forces the proxy; both ends of a stream must agree, so one rank that cannot (or
will not) puts the whole node on the proxy path. The kernels' side is core/tests/gpu/
test_cuda_ht_internode.py (rpn2, bitwise against uccl_ep.refs, with and without UCCL_EP_FORCE_PROXY).
"""

from __future__ import annotations

import pickle
import struct
from types import SimpleNamespace

import pytest

from uccl_ep.cuda import ht_proxy

pytestmark = pytest.mark.cpu


class _Mem:
    def __init__(self, name, device=0, nbytes=0):
        self.name, self.ptr, self.opened = name, 0x1000, []

    def ipc_handle(self):
        return self.name.encode()

    def open_peer(self, handle):
        self.opened.append(handle)
        return 0x100000 * (len(self.opened) + 1) + len(handle)


class _Table:
    made = []

    def __init__(self, device, nbytes):
        self.ptr, self.nbytes = 0xabc000, nbytes
        _Table.made.append(self)


def _engine(rank, R, G, blocked=()):
    drv = SimpleNamespace(can_access_peer=lambda dev, peer: (dev, peer) not in blocked, written={})
    drv.memcpy_htod = lambda dev, ptr, data: drv.written.__setitem__(ptr, data)
    return SimpleNamespace(rank=rank, R=R, G=G, dev=rank, drv=drv, mem=_Mem(f"region{rank}"),
                           state=_Mem(f"state{rank}"), mates=None)


def _run(me, R, G, oks=None, blocked=()):
    """Rank `me`'s _map_mates, with every other rank's answers to the two exchanges given."""
    eng = _engine(me, R, G, blocked)
    calls = []

    def all_gather(payload, phase):
        calls.append(phase)
        if len(calls) == 1:
            return [payload if r == me else pickle.dumps((r, f"region{r}".encode(), f"state{r}".encode()))
                    for r in range(R)]
        return [payload if r == me else pickle.dumps(True if oks is None else oks[r]) for r in range(R)]

    ht_proxy.ProxyNormalEngine._map_mates(eng, all_gather)
    assert len(calls) == 2
    return eng


@pytest.fixture(autouse=True)
def _fake_memory(monkeypatch):
    monkeypatch.setattr(ht_proxy, "DeviceMemory", _Table)
    monkeypatch.delenv("UCCL_EP_FORCE_PROXY", raising=False)


def test_node_mates_are_mapped_and_nobody_else():
    eng = _run(5, 8, 4)  # node 1 = ranks 4..7
    assert eng.mem.opened == [b"region4", b"region6", b"region7"]
    assert eng.state.opened == [b"state4", b"state6", b"state7"]
    table = struct.unpack("<16Q", eng.drv.written[eng.mates.ptr])
    for r in range(8):
        if r in (4, 6, 7):
            assert table[2 * r] != 0 and table[2 * r + 1] != 0
        else:
            assert table[2 * r] == table[2 * r + 1] == 0, r
    assert ht_proxy.ProxyNormalEngine.mates_ptr.fget(eng) == eng.mates.ptr


@pytest.mark.parametrize("why", ["a mate cannot see my GPU", "I cannot see a mate's GPU", "forced here"])
def test_one_rank_that_cannot_keeps_its_whole_node_on_the_proxy(why, monkeypatch):
    oks = [True] * 4
    blocked = ()
    if why == "a mate cannot see my GPU":
        oks[1] = False
    elif why == "I cannot see a mate's GPU":
        blocked = ((0, 1),)
    else:
        monkeypatch.setenv("UCCL_EP_FORCE_PROXY", "1")
    eng = _run(0, 4, 2, oks=oks, blocked=blocked)
    assert eng.mates is None and eng.mem.opened == [] and eng.state.opened == []
    assert ht_proxy.ProxyNormalEngine.mates_ptr.fget(eng) == 0
    # the other node is not held back by this one
    monkeypatch.delenv("UCCL_EP_FORCE_PROXY", raising=False)
    other = _run(2, 4, 2, oks=oks)
    assert other.mates is not None and other.mem.opened == [b"region3"]
