"""The HT kernels' tuning switches (UCCL_EP_HT_WARPS, UCCL_EP_HT_COMBINE_WARPS, UCCL_EP_HT_DEFINES):
parsed and refused with errors that name the variable; the -D lists the engine builds with."""

from __future__ import annotations

import pytest

from uccl_ep import env
from uccl_ep.cuda import ht_variants
from uccl_ep.errors import InvalidArgument


def test_defines_parse_into_the_build_flags():
    assert ht_variants.tuning_defines("") == ()
    got = ht_variants.tuning_defines(" UCCL_EP_HT_PUBLISH_EVERY=8  UCCL_EP_HT_RELAXED_HEAD=0 ")
    assert got == ("UCCL_EP_HT_PUBLISH_EVERY=8", "UCCL_EP_HT_RELAXED_HEAD=0")
    d, c = ht_variants.default_defines(4, 768, "UCCL_EP_HT_HEAD_SLACK=32")
    assert d == ("UCCL_EP_HT_THREADS=768", "UCCL_EP_HT_HEAD_SLACK=32")
    assert c == ("UCCL_EP_RANKS=4", "UCCL_EP_HT_THREADS=768", "UCCL_EP_HT_HEAD_SLACK=32")


@pytest.mark.parametrize("bad", ["PUBLISH=8", "UCCL_EP_HT_PUBLISH_EVERY", "UCCL_EP_HT_PUBLISH_EVERY=x",
                                 "UCCL_EP_LL_THING=1", "UCCL_EP_HT_THREADS=1024", "-DUCCL_EP_HT_PROF=1"])
def test_bad_defines_are_refused_by_name(bad):
    with pytest.raises(InvalidArgument) as e:
        ht_variants.tuning_defines(bad)
    assert "UCCL_EP_HT_DEFINES" in str(e.value) and bad in str(e.value)


def test_defines_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("UCCL_EP_HT_DEFINES", "UCCL_EP_HT_PROF=1")
    assert ht_variants.tuning_defines() == ("UCCL_EP_HT_PROF=1",)
    assert ht_variants.default_defines(2, 512)[1][-1] == "UCCL_EP_HT_PROF=1"


@pytest.mark.parametrize("name,value", [("UCCL_EP_HT_WARPS", "4"), ("UCCL_EP_HT_WARPS", "33"),
                                        ("UCCL_EP_HT_COMBINE_WARPS", "40"), ("UCCL_EP_HT_COMBINE_WARPS", "many")])
def test_warps_out_of_range_are_refused(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidArgument) as e:
        env.get(name)
    assert name in str(e.value)


def test_warp_defaults():
    assert env.REGISTRY["UCCL_EP_HT_WARPS"].default == 16
    assert env.REGISTRY["UCCL_EP_HT_COMBINE_WARPS"].default == 24


def test_combine_stage_areas_are_sized_and_bounded():
    assert ht_variants.combine_smem_bytes(768, "") == 0
    # 24 warps x 4 stages x 2 sources x 2 vectors x 32 lanes x 16 bytes
    assert ht_variants.combine_smem_bytes(768, "UCCL_EP_HT_COMBINE_STAGES=4") == 24 * 4 * 2 * 2 * 32 * 16
    assert ht_variants.combine_smem_bytes(512, "UCCL_EP_HT_COMBINE_STAGES=2 UCCL_EP_HT_COMBINE_UNROLL=4") == \
        16 * 2 * 2 * 4 * 32 * 16
    for bad in ("UCCL_EP_HT_COMBINE_STAGES=1", "UCCL_EP_HT_COMBINE_STAGES=8 UCCL_EP_HT_COMBINE_UNROLL=4"):
        with pytest.raises(InvalidArgument) as e:
            ht_variants.combine_smem_bytes(1024, bad)
        assert "UCCL_EP_HT_DEFINES" in str(e.value)

