"""When normal mode through the proxy sends its start-of-op handshake.

The handshake proves every peer finished reading the earlier ops' rings; the notify kernel sends it
before a cached dispatch or a combine only when a ring area the op uses was used with another
geometry (message size, slots, ring bases) since the last handshake -- a fresh dispatch's exchange
counts as one (ht/proxy/notify.cu, HTProxyState::area_geometry). The engine passes each op's area
keys (ProxyNormalEngine.geometry_keys); here the notify parameters of rank 0's engine (kernels
faked, a real loop proxy) go through the kernel's rule (the emulator's twin of it). That skipping
is safe (back-to-back ops in one geometry, a peer still in the previous op, faults) is shown end to
end in test_ht_internode_proxy_path.py.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ht_proxy_emulator import unpack  # noqa: E402
from test_ht_internode_proxy_path import _routing, engine  # noqa: E402,F401  (engine: a fixture)
from uccl_ep.config import Config  # noqa: E402
from uccl_ep.cuda import ht_proxy_plan as plan  # noqa: E402

pytestmark = pytest.mark.cpu
T, H, E, K, WORST = 40, 256, 8, 8, 200


def _ops(eng, R, log):
    """Run the sequence; returns per op whether the notify kernel would send the handshake (the
    kernel's rule applied to the keys the engine passed)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(T, H, generator=g).bfloat16()
    idx, w = _routing(T, E, K, g)
    in_rank = torch.zeros(T, R, dtype=torch.bool)
    for r in range(R):
        in_rank[:, r] = ((idx >= r * E // R) & (idx < (r + 1) * E // R)).any(1)
    ntpr, ntpe = in_rank.sum(0, dtype=torch.int32), torch.bincount(idx[idx >= 0], minlength=E).to(torch.int32)
    a, b = Config(6, 4, 32, 4, 16), Config(6, 4, 32, 4, 8)  # b: other ring depth
    y = torch.zeros(WORST, H, dtype=torch.bfloat16)
    area = [0, 0]   # HTProxyState::area_geometry
    sent = []

    def op(fn):
        n = len(log)
        fn()
        launched = [name for name, *_ in log[n:] if not name.startswith("ht_proxy_plan_")]  # a fresh dispatch's plan
        assert launched[0] == "ht_proxy_notify" and len(launched) == 2, launched
        p = unpack("HTProxyNotifyParams", next(params for name, _, _, params in log[n:] if name == "ht_proxy_notify"))
        keys = (p["area_geometry0"], p["area_geometry1"])
        changed = any(k and area[i] and area[i] != k for i, k in enumerate(keys))
        if not p["handshake"] or changed:  # a fresh exchange, or a handshake sent
            area[:] = keys
            sent.append(True)
        else:
            area[:] = [k or area[i] for i, k in enumerate(keys)]
            sent.append(False)
        return keys

    h = None

    def fresh():
        nonlocal h
        h = eng.dispatch(x, None, idx, w, ntpr, in_rank, ntpe, 1, WORST, a)[5]

    keys = [op(fresh),
            op(lambda: eng.cached_dispatch(x, None, h, a)),
            op(lambda: eng.cached_dispatch(x, None, h, a)),
            op(lambda: eng.combine(y, h, None, (None, None), a)),
            op(lambda: eng.combine(y, h, None, (None, None), a)),
            op(lambda: eng.cached_dispatch(x, None, h, a)),
            op(lambda: eng.cached_dispatch(x, None, h, b))]
    assert all(k % 2 == 1 for ks in keys for k in ks if k), keys  # nonzero where used
    return sent, keys


def test_one_area_handshakes_only_where_the_geometry_changes(engine):  # noqa: F811
    # the shapes make every message size differ: fresh dispatch (top-k), cached dispatch, combine
    assert len({plan.dispatch_msg_bytes(2 * H, 0, K), plan.dispatch_msg_bytes(2 * H, 0, 0),
                plan.combine_msg_bytes(H, 0)}) == 3
    sent, keys = _ops(engine.eng, engine.R, engine.log)
    assert all(k[1] == 0 for k in keys)  # one rank per node: area 0 only
    assert keys[1] == keys[2] == keys[5] and keys[3] == keys[4] and len({keys[0], keys[1], keys[3], keys[6]}) == 4
    # fresh (its exchange), cached (another message size), cached again (no), combine (another
    # geometry), combine again (no), back to dispatch, other ring depth (Config b)
    assert sent == [True, True, False, True, False, True, True], sent
