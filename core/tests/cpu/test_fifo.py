"""The host half of the proxy FIFO: lap-parity commit, wrap-around, back-pressure, completion
indices, and a multi-producer stress whose consumer checks a checksum and per-producer order of
every command."""

import pytest

from uccl_ep.proxy import native

pytestmark = pytest.mark.cpu

C = native()


def test_capacity_must_be_a_power_of_two():
    for bad in (0, 1, 3, 100, 1 << 25):
        with pytest.raises(ValueError, match="power of two"):
            C.HostFifo(bad)


def test_push_peek_pop_and_wrap_around_with_zero_commands():
    f = C.HostFifo(4)
    assert f.peek() is None
    # Zero payloads are legal: the commit bit alone says a slot is full.
    for lap in range(5):
        idx = [f.push(0, 0, 1.0), f.push(lap, 7, 1.0)]
        assert idx == [lap * 2, lap * 2 + 1]
        assert f.peek() == (0, 0)
        f.pop()
        assert f.peek() == (lap, 7)
        f.pop()
        # Stale data of the previous lap is never seen as a new command.
        assert f.peek() is None
    assert f.consumer_index == 10 and f.reserved == 10


def test_full_ring_applies_back_pressure():
    f = C.HostFifo(4)
    for i in range(4):
        assert f.push(i, i, 1.0) == i
    assert f.push(9, 9, 0.05) is None          # full: gives up after the timeout, reserves nothing
    assert f.reserved == 4
    assert f.peek() == (0, 0)
    f.pop()
    assert f.push(4, 4, 1.0) == 4              # one slot freed
    assert f.push(5, 5, 0.01) is None
    f.set_status(1)                             # stopped proxy: producers stop waiting at once
    assert f.push(6, 6, 30.0) is None


def test_completion_indices():
    f = C.HostFifo(8)
    idx = [f.push(1, 1, 1.0) for _ in range(3)]
    assert not any(f.check_completion(i) for i in idx)
    f.publish_completed(2)
    assert [f.check_completion(i) for i in idx] == [True, True, False]
    f.publish_completed(3)
    assert f.check_completion(2) and not f.check_completion(3)


@pytest.mark.parametrize("capacity,producers,per", [(64, 4, 20000), (2, 3, 2000), (1024, 1, 50000)])
def test_multi_producer_stress(capacity, producers, per):
    r = C.fifo_stress(capacity, producers, per, 60.0)
    assert r["timeouts"] == 0
    assert r["pushed"] == r["consumed"] == producers * per
    assert r["corrupt"] == 0 and r["out_of_order"] == 0


def test_slow_consumer_forces_full_ring_waits():
    r = C.fifo_stress(4, 3, 300, 60.0, 20000)
    assert (r["consumed"], r["corrupt"], r["out_of_order"], r["timeouts"]) == (900, 0, 0, 0)
    assert r["seconds"] >= 900 * 20e-6 * 0.9


@pytest.mark.slow
def test_multi_producer_stress_full_count():
    r = C.fifo_stress(256, 8, 500000, 300.0)
    assert r["pushed"] == r["consumed"] == 4_000_000
    assert r["corrupt"] == 0 and r["out_of_order"] == 0


def test_fifo_layout_addresses_match_the_ring():
    """What a GPU runtime reads from Proxy.fifo_layout: slot words with the lap-parity commit bit
    (fifo_layout.h), head and tail at the advertised addresses."""
    import ctypes
    import hashlib

    p = C.Proxy(dict(token_digest=hashlib.sha256(b"layout").hexdigest(), num_threads=1, fifos_per_thread=1,
                     fifo_capacity=4))
    lay = p.fifo_layout(0)
    u64 = lambda addr: ctypes.c_uint64.from_address(addr).value  # noqa: E731
    cmds = [C.encode_counted_write(0, 16 * i, 32 * i, 100 + i, i) for i in range(6)]
    for i, (w0, w1) in enumerate(cmds[:4]):     # not started: nothing consumes, lap 0 commits with bit 1
        assert p.push(0, w0, w1, 1.0) == i
        slot = lay["slots"] + 16 * i
        assert u64(slot) == w0 and u64(slot + 8) == w1 | (1 << 63)
    assert u64(lay["head"]) == 4 and u64(lay["tail"]) == 0 and u64(lay["completed"]) == 0
    assert lay["capacity"] == 4 and lay["capacity_log2"] == 2
    assert lay["memory"] <= lay["head"] < lay["slots"] + 16 * 4 <= lay["memory"] + lay["memory_bytes"]
    p.stop()
