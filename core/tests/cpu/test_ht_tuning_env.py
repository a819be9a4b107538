"""The HT kernels' tuning switches (UCCL_EP_HT_WARPS, UCCL_EP_HT_COMBINE_WARPS, UCCL_EP_HT_DEFINES):
parsed and refused with errors that name the variable; the -D lists the engine builds with."""

from __future__ import annotations

import pytest

from uccl_ep import env
from uccl_ep.cuda import ht_variants, jit
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
    assert env.REGISTRY["UCCL_EP_HT_COMBINE_WARPS"].default == 16


def test_combine_stage_areas_are_sized_and_bounded():
    # default on sm_80+: 2 stages x 4 vectors; 16 warps x 2 stages x 2 sources x 4 x 32 lanes x 16 bytes
    assert ht_variants.combine_staging("") == (2, 4)
    assert ht_variants.combine_smem_bytes(512, "") == 16 * 2 * 2 * 4 * 32 * 16
    assert ht_variants.combine_smem_bytes(512, "", sm=75) == 0  # no cp.async: the register pipeline
    assert ht_variants.combine_staging("", sm=75) == (0, 2)
    assert ht_variants.combine_smem_bytes(768, "UCCL_EP_HT_COMBINE_STAGES=0") == 0
    assert ht_variants.combine_staging("UCCL_EP_HT_COMBINE_STAGES=0") == (0, 2)
    assert ht_variants.combine_smem_bytes(768, "UCCL_EP_HT_COMBINE_STAGES=4 UCCL_EP_HT_COMBINE_UNROLL=2") == \
        24 * 4 * 2 * 2 * 32 * 16
    for warps, bad in ((32, "UCCL_EP_HT_COMBINE_STAGES=1"), (32, "UCCL_EP_HT_COMBINE_STAGES=8"), (32, "")):
        with pytest.raises(InvalidArgument) as e:
            ht_variants.combine_smem_bytes(warps * 32, bad)
        assert "UCCL_EP_HT_DEFINES" in str(e.value)
    assert ht_variants.combine_smem_bytes(32 * 32, "UCCL_EP_HT_COMBINE_UNROLL=2") == 32 * 2 * 2 * 2 * 32 * 16


def test_combine_staging_defaults_match_the_header():
    """combine_staging's defaults are the ones ht_tuning.cuh compiles with (Python sizes the shared
    memory of what the header builds)."""
    text = (jit.include_dir() / "uccl_ep/device/ht_tuning.cuh").read_text()
    assert "#define UCCL_EP_HT_COMBINE_STAGES 2" in text and "#define UCCL_EP_HT_COMBINE_STAGES 0" in text
    assert "__CUDA_ARCH__ >= 800" in text
    assert "#define UCCL_EP_HT_COMBINE_UNROLL (UCCL_EP_HT_COMBINE_STAGES ? 4 : 2)" in text


def test_warps_per_peer_follows_the_env_and_the_variant(monkeypatch):
    for name in ("UCCL_EP_HT_WARPS", "UCCL_EP_HT_COMBINE_WARPS", "UCCL_EP_HT_VARIANT"):
        monkeypatch.delenv(name, raising=False)
    assert ht_variants.warps_per_peer(2) == (8, 8)
    assert ht_variants.warps_per_peer(8) == (2, 2)
    monkeypatch.setenv("UCCL_EP_HT_COMBINE_WARPS", "24")
    assert ht_variants.warps_per_peer(2) == (8, 12)
    assert ht_variants.warps_per_peer(8) == (2, 3)
    monkeypatch.setenv("UCCL_EP_HT_COMBINE_WARPS", "0")  # 0: as dispatch
    assert ht_variants.warps_per_peer(4) == (4, 4)
    monkeypatch.delenv("UCCL_EP_HT_COMBINE_WARPS")
    monkeypatch.setenv("UCCL_EP_HT_VARIANT", "tma")  # the bulk variants keep one block size
    assert ht_variants.warps_per_peer(2) == (8, 8)
    monkeypatch.setenv("UCCL_EP_HT_WARPS", "8")
    with pytest.raises(InvalidArgument, match="UCCL_EP_HT_WARPS"):
        ht_variants.warps_per_peer(9)


def test_ranks_must_agree_on_block_sizes():
    ht_variants.check_same_block_sizes([(8, 12), (8, 12)])
    with pytest.raises(InvalidArgument) as e:
        ht_variants.check_same_block_sizes([(8, 12), (8, 8)])
    assert "rank 1: 8/8" in str(e.value) and "UCCL_EP_HT_COMBINE_WARPS" in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        ht_variants.check_same_block_sizes([(8, 12), "invalid argument `UCCL_EP_HT_WARPS`: expected a value <= 32"])
    assert "rank 1" in str(e.value) and "<= 32" in str(e.value)
