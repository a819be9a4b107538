"""TransferCmd and 32-bit immediate encode/decode at every field limit (protocol.h, immediate.h).

Expected values are written from the layout documented in the headers (bit positions and widths),
not read back from the code under test.
"""

import random

import pytest

from uccl_ep.proxy import native, protocol_limits

pytestmark = pytest.mark.cpu

C = native()

KIND_COUNTED, KIND_ORDERED, KIND_ATOMIC, KIND_CONTROL = 0, 1, 2, 3
WRITE, ATOMIC, QUIET, BARRIER = 1, 2, 3, 4


def test_limits_follow_the_documented_widths():
    lim = protocol_limits()
    assert lim["cmd_bytes"] == 16
    assert lim["max_ranks"] == 1 << 12
    assert lim["max_write_bytes"] == (1 << 24) - 1
    assert lim["offset_unit_bytes"] == 16
    assert lim["max_region_bytes"] == (1 << 31) * 16
    assert lim["max_counters"] == 1 << 13
    assert lim["max_increment"] == (1 << 9) - 1
    assert (lim["min_atomic_value"], lim["max_atomic_value"]) == (-(1 << 15), (1 << 15) - 1)
    assert lim["max_fenced_count"] == (1 << 15) - 2
    assert lim["max_ordered_counters"] == 1 << 10
    assert lim["seq_modulus"] == 1 << 11 and lim["max_ordered_in_flight"] == 1 << 10
    assert lim["epoch_modulus"] == 1 << 24


def _bits(word, shift, width):
    return (word >> shift) & ((1 << width) - 1)


@pytest.mark.parametrize("dst,soff,doff,length,counter", [
    (0, 0, 0, 0, 0),
    (4095, ((1 << 31) - 1) * 16, ((1 << 31) - 1) * 16, (1 << 24) - 1, 8191),
    (1234, 16, 32 * 1024 ** 3 - 16, 7168, 4096),
])
def test_counted_write_fields_at_limits(dst, soff, doff, length, counter):
    w0, w1 = C.encode_counted_write(dst, soff, doff, length, counter)
    # word0: type [0,3) flag [3,4) dst [4,16) len [16,40) counter [40,53) increment [53,62)
    assert _bits(w0, 0, 3) == WRITE and _bits(w0, 3, 1) == 0
    assert _bits(w0, 4, 12) == dst and _bits(w0, 16, 24) == length and _bits(w0, 40, 13) == counter
    assert _bits(w0, 53, 9) == 0 and _bits(w0, 62, 2) == 0
    # word1: src_off [0,31) dst_off [31,62) in 16-byte units; bit 63 (commit) belongs to the FIFO
    assert _bits(w1, 0, 31) * 16 == soff and _bits(w1, 31, 31) * 16 == doff and w1 >> 62 == 0
    d = C.decode_cmd(w0, w1)
    assert (d["type"], d["dst_rank"], d["len"], d["counter"], d["src_off"], d["dst_off"]) == \
        (WRITE, dst, length, counter, soff, doff)
    assert d["flag"] is False and d["reserved_clear"]


@pytest.mark.parametrize("counter,inc", [(0, 0), (1023, 511), (17, 1)])
def test_ordered_write_fields(counter, inc):
    w0, w1 = C.encode_ordered_write(7, 48, 4096, 100, counter, inc)
    assert _bits(w0, 3, 1) == 1 and _bits(w0, 53, 9) == inc and _bits(w0, 40, 13) == counter
    d = C.decode_cmd(w0, w1)
    assert d["flag"] and d["increment"] == inc and d["counter"] == counter


@pytest.mark.parametrize("value", [-(1 << 15), -1, 0, 1, (1 << 15) - 1])
@pytest.mark.parametrize("fenced", [False, True])
def test_atomic_value_is_sign_extended(value, fenced):
    w0, w1 = C.encode_atomic(4095, 8191, value, fenced)
    assert _bits(w0, 0, 3) == ATOMIC and _bits(w0, 3, 1) == int(fenced)
    assert _bits(w0, 16, 16) == value & 0xFFFF and w1 == 0
    d = C.decode_cmd(w0, w1)
    assert d["value"] == value and d["counter"] == 8191 and d["dst_rank"] == 4095


def test_quiet_and_barrier():
    for whole in (False, True):
        w0, w1 = C.encode_quiet(whole)
        assert (_bits(w0, 0, 3), _bits(w0, 3, 1), w1) == (QUIET, int(whole), 0)
    for rail in (False, True):
        w0, w1 = C.encode_barrier(rail)
        assert (_bits(w0, 0, 3), _bits(w0, 3, 1), w1) == (BARRIER, int(rail), 0)


def test_host_encoders_reject_misaligned_offsets():
    from uccl_ep.errors import InvalidArgument
    with pytest.raises(InvalidArgument, match="multiples of 16"):
        C.encode_counted_write(1, 8, 0, 16, 0)
    with pytest.raises(InvalidArgument, match="multiples of 16"):
        C.encode_ordered_write(1, 0, 1000, 16, 0, 1)


def test_reserved_bits_are_detected():
    w0, w1 = C.encode_counted_write(1, 0, 0, 16, 0)
    assert C.decode_cmd(w0 | (1 << 62), w1)["reserved_clear"] is False
    assert C.decode_cmd(w0, w1 | (1 << 62))["reserved_clear"] is False


@pytest.mark.parametrize("counter", [0, 1, 4095, 8191])
def test_imm_counted(counter):
    v = C.imm_counted(counter)
    assert v >> 30 == KIND_COUNTED and v & 0x1FFF == counter and v >> 13 == 0
    d = C.imm_decode(v)
    assert d["kind"] == KIND_COUNTED and d["counter"] == counter and d["well_formed"]
    # any stray bit outside the counter makes it malformed
    for bit in (13, 20, 29):
        assert C.imm_decode(v | (1 << bit))["well_formed"] is False


@pytest.mark.parametrize("counter,seq,inc", [(0, 0, 0), (1023, 2047, 511), (5, 1024, 17)])
def test_imm_ordered(counter, seq, inc):
    v = C.imm_ordered(counter, seq, inc)
    # [0,10) counter [10,21) seq [21,30) increment
    assert v >> 30 == KIND_ORDERED and _bits(v, 0, 10) == counter and _bits(v, 10, 11) == seq and _bits(v, 21, 9) == inc
    d = C.imm_decode(v)
    assert (d["kind"], d["counter"], d["seq"], d["increment"]) == (KIND_ORDERED, counter, seq, inc)


@pytest.mark.parametrize("value", [-(1 << 15), -5, 0, 1, (1 << 15) - 1])
@pytest.mark.parametrize("fenced", [False, True])
@pytest.mark.parametrize("counter", [0, 8191])
def test_imm_atomic(counter, value, fenced):
    v = C.imm_atomic(counter, value, fenced)
    # [0,13) counter [13,29) value [29] fenced
    assert v >> 30 == KIND_ATOMIC and _bits(v, 0, 13) == counter and _bits(v, 13, 16) == value & 0xFFFF
    assert _bits(v, 29, 1) == int(fenced)
    d = C.imm_decode(v)
    assert (d["counter"], d["value"], d["fenced"], d["well_formed"]) == (counter, value, fenced, True)


@pytest.mark.parametrize("op,arg", [(1, 0), (2, (1 << 24) - 1), (6, 12345)])
def test_imm_control(op, arg):
    v = C.imm_control(op, arg)
    assert v >> 30 == KIND_CONTROL and _bits(v, 24, 6) == op and _bits(v, 0, 24) == arg
    d = C.imm_decode(v)
    assert (d["op"], d["arg"], d["well_formed"]) == (op, arg, True)
    assert C.imm_decode(C.imm_control(0, arg))["well_formed"] is False


def test_random_round_trips():
    rng = random.Random(7)
    for _ in range(2000):
        dst, counter, inc = rng.randrange(4096), rng.randrange(8192), rng.randrange(512)
        soff, doff = rng.randrange(1 << 31) * 16, rng.randrange(1 << 31) * 16
        length = rng.randrange(1 << 24)
        d = C.decode_cmd(*C.encode_ordered_write(dst, soff, doff, length, counter % 1024, inc))
        assert (d["dst_rank"], d["src_off"], d["dst_off"], d["len"], d["counter"], d["increment"]) == \
            (dst, soff, doff, length, counter % 1024, inc)
        value = rng.randrange(-(1 << 15), 1 << 15)
        assert C.imm_decode(C.imm_atomic(counter, value, True))["value"] == value
