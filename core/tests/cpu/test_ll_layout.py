"""The NVLink low-latency engine's buffer layout (uccl_ep/cuda/ll.py) against what kernels write and
what DeepEP callers allocate (Buffer.get_low_latency_rdma_size_hint), and its block-size switch."""

from __future__ import annotations

import pytest

from uccl_ep.config import low_latency_rdma_size_hint
from uccl_ep.cuda import ll
from uccl_ep.errors import InvalidArgument


@pytest.mark.parametrize("hidden", [128, 256, 384, 512, 1024, 2048, 4096, 7168, 8192])
def test_layout_fits_the_size_hint(hidden):
    """Two buffer sets fit the hint's bytes for every rank count, experts per rank and token count."""
    for t in (1, 2, 5, 64, 128, 256, 1024):
        for R in (1, 2, 3, 4, 8, 16, 32, 64):
            for e_loc in (1, 2, 3, 9, 36, 128):
                E = R * e_loc
                lay = ll._Layout.make(t, hidden, E, R)
                assert 2 * lay.set_bytes <= low_latency_rdma_size_hint(t, hidden, R, E), (t, hidden, R, E)


def test_receive_area_holds_dispatch_tokens_index_and_combine_rows():
    """ll/nvlink/dispatch.cu: token area [R][num_max] messages; ll/nvlink/combine.cu: [E][num_max] BF16 rows; past
    both, the u64 flags [E][num_max] of both kernels (a flag that overlapped another op's bytes could
    read as a current tag). Areas start 16-byte aligned."""
    for t, H, R, E in ((128, 7168, 2, 288), (1, 512, 64, 64), (256, 4096, 8, 256), (3, 2048, 4, 12),
                       (64, 128, 8, 8), (5, 256, 4, 4)):
        lay = ll._Layout.make(t, H, E, R)
        recv = lay.sig_off - lay.recv_off
        token_area = (R * t * lay.msg_bytes + 15) // 16 * 16
        assert lay.flag_off >= token_area and lay.flag_off >= E * t * 2 * H, (t, H, R, E)
        assert recv >= lay.flag_off + E * t * 8
        assert lay.msg_bytes == 2 * H and H + H // 128 * 4 <= lay.msg_bytes  # BF16 row; FP8 row + scales
        assert lay.recv_off - lay.send_off >= E * t * 2 * H  # zero-copy combine input
        assert all(off % 16 == 0 for off in (lay.send_off, lay.recv_off, lay.flag_off, lay.sig_off, lay.set_bytes))
        assert lay.set_bytes - lay.sig_off >= E * 8  # dispatch signals, u64 each


def test_combine_recv_threads_switch():
    from uccl_ep.tuning import Tuning
    assert ll._combine_recv_threads() == 512
    assert ll._combine_recv_threads(Tuning(ll_combine_recv_threads=256)) == 256
    for bad in (100, 1024, 0):
        with pytest.raises(InvalidArgument) as e:
            ll._combine_recv_threads(Tuning(ll_combine_recv_threads=bad))
        assert "tuning.ll_combine_recv_threads" in str(e.value)
