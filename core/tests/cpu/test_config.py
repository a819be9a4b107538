"""Config checks, DeepEP's tuned config tables and buffer size hints (hand-computed values)."""

import pytest

import uccl_ep
from uccl_ep import Buffer, Config
from uccl_ep.errors import InvalidArgument

pytestmark = pytest.mark.cpu

MiB = 1 << 20


def test_low_latency_size_hint_matches_deepep_examples():
    # DeepEP's own figures: T=128, H=7168, E=256 -> 1820 MiB; E=288 -> 2048 MiB; T=256 -> 3640 MiB.
    assert Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 256) // MiB == 1820
    assert round(Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 288) / MiB) == 2048  # 2047.5 MiB
    assert Buffer.get_low_latency_rdma_size_hint(256, 7168, 8, 256) // MiB == 3640
    # keyword names are part of the API (vLLM calls it by keyword)
    kw = Buffer.get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank=128, hidden=7168, num_ranks=2,
                                               num_experts=256)
    assert kw == Buffer.get_low_latency_rdma_size_hint(128, 7168, 16, 256)  # independent of num_ranks
    assert kw % 128 == 0
    assert uccl_ep.get_low_latency_rdma_size_hint(16, 256, 2, 8) == Buffer.get_low_latency_rdma_size_hint(16, 256, 2, 8)


def test_low_latency_size_hint_small_case_by_hand():
    # T=2, H=256, E=4: dispatch msg = 16 + max(512, 256 + 8) = 528; combine msg = 8 + 512 = 520
    # send = max(2*528, 4*2*520) = 4160; recv = 4*2*528 = 4224; signal = align128(16) = 128
    assert Buffer.get_low_latency_rdma_size_hint(2, 256, 2, 4) == 2 * (4160 + 4224 + 128)


def test_dispatch_and_combine_tables():
    Buffer.set_num_sms(24)
    try:
        d2, c8 = Buffer.get_dispatch_config(2), Buffer.get_combine_config(8)
        assert (d2.num_sms, d2.num_max_nvl_chunked_send_tokens, d2.num_max_nvl_chunked_recv_tokens) == (24, 24, 256)
        # the RDMA chunk of one-node sizes is uccl-ep's measured proxy-path value (DeepEP never reads it)
        assert (c8.num_max_nvl_chunked_send_tokens, c8.num_max_rdma_chunked_send_tokens) == (4, 12)
        assert Buffer.get_dispatch_config(160).num_max_nvl_chunked_recv_tokens == 720
        # sizes DeepEP lacks take the next tuned size instead of asserting
        assert Buffer.get_dispatch_config(3) == Buffer.get_dispatch_config(4).__class__(24, 6, 256, 12, 128)
    finally:
        Buffer.set_num_sms(20)


def test_nvl_hint_by_hand():
    cfg = Config(2, 1, 4, 1, 4)  # 1 channel, 4 recv slots
    hidden_bytes, ranks = 256, 2
    slots = 1 * 2 * 4
    expect = 1 * 2 * (2 * 1 + 3) * 4 + slots * (hidden_bytes + 8 + 128 * 8 + 128 * 4 + 128 * 4)
    expect = (expect + 127) // 128 * 128
    assert cfg.get_nvl_buffer_size_hint(hidden_bytes, ranks) == expect
    assert cfg.get_rdma_buffer_size_hint(hidden_bytes, 8) == 0
    assert cfg.get_rdma_buffer_size_hint(hidden_bytes, 16) > 0


def test_config_positional_keyword_and_rounding():
    a = Config(24, 6, 256, 6, 128)
    b = Config(num_sms=24, num_max_nvl_chunked_send_tokens=6, num_max_nvl_chunked_recv_tokens=256,
               num_max_rdma_chunked_send_tokens=6, num_max_rdma_chunked_recv_tokens=128)
    assert a == b and hash(a) == hash(b)
    assert Config(20, 6, 256, 12, 100).num_max_rdma_chunked_recv_tokens == 108  # rounded up to a multiple of 12
    assert "num_sms=24" in repr(a)


@pytest.mark.parametrize("args,name", [
    ((21,), "num_sms"),
    ((20, 256, 256), "num_max_nvl_chunked_send_tokens"),
    ((20, 6, 256, 65, 128), "num_max_rdma_chunked_send_tokens"),
    ((0,), "num_sms"),
    (("20",), "num_sms"),
])
def test_config_errors_name_the_argument(args, name):
    with pytest.raises(InvalidArgument, match=name):
        Config(*args)


def test_set_num_sms_validates_and_is_global():
    with pytest.raises(InvalidArgument, match="new_num_sms"):
        Buffer.set_num_sms(7)
    Buffer.set_num_sms(32)
    try:
        assert Buffer.num_sms == 32 and Buffer.get_dispatch_config(2).num_sms == 32
    finally:
        Buffer.set_num_sms(20)
