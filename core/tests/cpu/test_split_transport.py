"""The split transport `<local>+<remote>` (core/csrc/transport/split.cc): a rank reaches the ranks
of its own node through <local> and every other rank through <remote>. Here `ipc+fabric` on CPU:
ipc in its host-memory mode (memcpy engine, shared-memory regions) and fabric over tcp;ofi_rxm,
2 nodes x 2 ranks in separate processes, with and without the fault decorator on top. The cuda
backend uses the same split between hosts (GPU memory: FI_HMEM, not available here).
"""

import pytest

from multirank import run_ranks
from test_host_executor import FAULT_ENV, _check, _ht_worker
from test_transport import _streams_worker
from uccl_ep.proxy import native

pytestmark = [pytest.mark.cpu,
              pytest.mark.skipif(bool(native().transport_unavailable_reason("fabric")), reason="libfabric missing")]

C = native()
FAULT = "reorder=1,delay=24,tear=0.5,pieces=4,seed={seed}"


def test_split_names_are_checked():
    assert C.transport_unavailable_reason("ipc+fabric") == ""
    assert "unknown transport 'nope'" in C.transport_unavailable_reason("ipc+nope")


def test_random_streams_cross_both_halves():
    """Every command kind, random sizes, every byte and counter checked (proxy.streams); node mates
    through ipc, the other node through fabric, nothing of the other node in ipc's counters."""
    results = run_ranks(_streams_worker, 4, [("ipc+fabric", ""), ("ipc+fabric", FAULT)], 3, 2, timeout_s=300)
    for rank, per_rank in enumerate(results):
        for _, faulty, name, n, counters in per_rank:
            assert n > 200
            assert name == ("fault:" if faulty else "") + "ipc:host+fabric:tcp;ofi_rxm", name
            mate, others = rank ^ 1, [r for r in range(4) if r // 2 != rank // 2]
            assert counters[f"ipc_delivered_to_{mate}"] > 0, counters
            assert all(counters.get(f"ipc_delivered_to_{r}", 0) == 0 for r in others), counters
            if faulty:
                assert counters["fault_held_writes"] > 0 and counters["fault_torn_writes"] > 0, counters


def test_host_executor_internode_over_split_matches_reference():
    """The host executor's two-level normal mode (dedup per node, forwarding inside it) with the
    forwarding hop on ipc and the node hop on fabric, faults on, against the reference."""
    env = dict(FAULT_ENV, UCCL_EP_TRANSPORT="ipc+fabric")
    _check(run_ranks(_ht_worker, 4, 2, 53, ["random", "fp8"], timeout_s=300, env=env))
