"""GroupStore exchanges over a real TCPStore: messages of any size arrive whole, and none is left behind."""

from __future__ import annotations

import hashlib
import random

import pytest
import torch.distributed as dist

from multirank import run_ranks

pytestmark = pytest.mark.cpu


def _payload(src: int, dst: int, size: int) -> bytes:
    """Bytes no two parts of which are alike, the same in every process."""
    return random.Random(src * 1000 + dst).randbytes(size)


def _digest(b: bytes) -> tuple[int, str]:
    return len(b), hashlib.sha256(b).hexdigest()


def _exchange_worker(rank, world, sizes):
    from uccl_ep.group_store import GroupStore
    ch = GroupStore(dist.group.WORLD, 60.0, "sizes")
    try:
        seen = []
        for size in sizes:
            sent = [None if dst == (rank + 1) % world else _payload(rank, dst, size) for dst in range(world)]
            got = ch.exchange(sent, f"size {size}")
            seen.append([None if b is None else _digest(b) for b in got])
        keys = (ch._key(op, src, rank) for op in range(len(sizes)) for src in range(world))
        left = [k for k in keys if ch.store.check([k]) or ch.store.check([k + "/0"])]
        dist.barrier()  # rank 0 hosts the store: it stays until every rank has looked at it
        return seen, left
    finally:
        ch.close()


def test_exchange_carries_payloads_over_the_store_value_limit():
    # 9 MiB + 5 is over torch's 8 MiB TCPStore value cap and not a multiple of the part size
    sizes = [0, 1000, (9 << 20) + 5]
    out = run_ranks(_exchange_worker, 3, sizes, timeout_s=180)
    for rank, (seen, left) in enumerate(out):
        assert left == [], left
        for i, size in enumerate(sizes):
            for src, got in enumerate(seen[i]):
                if rank == (src + 1) % 3:  # src sent this rank None
                    assert got is None
                else:
                    assert got == _digest(_payload(src, rank, size)), (rank, src, size)


def _host_exits_worker(rank, world):
    import os

    from uccl_ep.errors import PeerFailure
    from uccl_ep.group_store import GroupStore
    ch = GroupStore(dist.group.WORLD, 30.0, "host-exits")
    ch.barrier("both made")
    if rank == 0:  # the TCPStore's host: leaves once rank 1 is past the barrier (and done reading it)
        ch.store.wait(["host-exits/rank1-past-barrier"])
        os._exit(0)
    ch.store.set("host-exits/rank1-past-barrier", b"1")
    try:
        ch.exchange([b"x"] * world, "after the host left")
    except PeerFailure as e:
        return type(e.__cause__).__name__, e.phase, str(e)
    except Exception as e:  # noqa: BLE001 - the test reports what came instead
        return "raw", type(e).__name__, str(e)
    finally:
        ch.close()
    return "returned", "", ""


def test_a_store_whose_host_exited_is_a_peer_failure_naming_the_phase():
    """The process that hosts the group's Store exits: a rank inside an exchange gets PeerFailure
    naming the exchange's phase, not the Store client's connection error."""
    (_, (cause, phase, text)) = run_ranks(_host_exits_worker, 2, timeout_s=120, may_die=(0,))
    assert phase == "after the host left", (cause, phase, text)
    assert "Store stopped answering" in text and "rank 1" in text, text
