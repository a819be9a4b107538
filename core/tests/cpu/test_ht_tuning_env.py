"""The HT kernels' tuning (Tuning.ht_warps, .ht_combine_warps, .ht_defines): parsed and refused with
errors that name the argument; the -D lists the engine builds and loads its
kernels with (uccl_ep/cuda/ht_tuning.py)."""

from __future__ import annotations

import re

import pytest

from uccl_ep.tuning import Tuning
from uccl_ep.cuda import ht_tuning, jit
from uccl_ep.errors import InvalidArgument


def test_defines_parse_into_the_build_flags():
    assert ht_tuning.tuning_defines("") == ()
    got = ht_tuning.tuning_defines(" UCCL_EP_HT_PUBLISH_EVERY=8  UCCL_EP_HT_RELAXED_HEAD=0 ")
    assert got == ("UCCL_EP_HT_PUBLISH_EVERY=8", "UCCL_EP_HT_RELAXED_HEAD=0")
    d, c = ht_tuning.kernel_defines(4, 768, "UCCL_EP_HT_HEAD_SLACK=32")
    assert d == ("UCCL_EP_HT_THREADS=768", "UCCL_EP_HT_HEAD_SLACK=32")
    assert c == ("UCCL_EP_RANKS=4", "UCCL_EP_HT_THREADS=768", "UCCL_EP_HT_HEAD_SLACK=32")


@pytest.mark.parametrize("bad", ["PUBLISH=8", "UCCL_EP_HT_PUBLISH_EVERY", "UCCL_EP_HT_PUBLISH_EVERY=x",
                                 "UCCL_EP_LL_THING=1", "UCCL_EP_HT_THREADS=1024", "-DUCCL_EP_HT_PROF=1"])
def test_bad_defines_are_refused_by_name(bad):
    with pytest.raises(InvalidArgument) as e:
        ht_tuning.tuning_defines(bad)
    assert "tuning.ht_defines" in str(e.value) and bad in str(e.value)


def test_defines_reach_the_build_flags():
    assert ht_tuning.tuning_defines() == ()
    assert ht_tuning.kernel_defines(2, 512, Tuning(ht_defines="UCCL_EP_HT_PROF=1").ht_defines)[1][-1] == \
        "UCCL_EP_HT_PROF=1"


@pytest.mark.parametrize("name,value", [("ht_warps", 4), ("ht_warps", 33), ("ht_combine_warps", 40),
                                        ("ht_combine_warps", "many")])
def test_warps_out_of_range_are_refused(name, value):
    with pytest.raises(InvalidArgument) as e:
        Tuning(**{name: value})
    assert f"tuning.{name}" in str(e.value)


def test_warp_defaults():
    assert (Tuning().ht_warps, Tuning().ht_combine_warps) == (16, 16)


def test_combine_stage_areas_are_sized_and_bounded():
    # default on sm_80+: 2 stages x 4 vectors; 16 warps x 2 stages x 2 sources x 4 x 32 lanes x 16 bytes
    assert ht_tuning.combine_staging("") == (2, 4)
    assert ht_tuning.combine_smem_bytes(512, "") == 16 * 2 * 2 * 4 * 32 * 16
    assert ht_tuning.combine_smem_bytes(512, "", sm=75) == 0  # no cp.async: the register pipeline
    assert ht_tuning.combine_staging("", sm=75) == (0, 2)
    assert ht_tuning.combine_smem_bytes(768, "UCCL_EP_HT_COMBINE_STAGES=0") == 0
    assert ht_tuning.combine_staging("UCCL_EP_HT_COMBINE_STAGES=0") == (0, 2)
    assert ht_tuning.combine_smem_bytes(768, "UCCL_EP_HT_COMBINE_STAGES=4 UCCL_EP_HT_COMBINE_UNROLL=2") == \
        24 * 4 * 2 * 2 * 32 * 16
    for warps, bad in ((32, "UCCL_EP_HT_COMBINE_STAGES=1"), (32, "UCCL_EP_HT_COMBINE_STAGES=8"), (32, "")):
        with pytest.raises(InvalidArgument) as e:
            ht_tuning.combine_smem_bytes(warps * 32, bad)
        assert "tuning.ht_defines" in str(e.value)
    assert ht_tuning.combine_smem_bytes(32 * 32, "UCCL_EP_HT_COMBINE_UNROLL=2") == 32 * 2 * 2 * 2 * 32 * 16


def test_combine_staging_defaults_match_the_header():
    """combine_staging's defaults are the ones ht_tuning.cuh compiles with (Python sizes the shared
    memory of what the header builds)."""
    text = (jit.include_dir() / "uccl_ep/device/ht_tuning.cuh").read_text()
    assert "#define UCCL_EP_HT_COMBINE_STAGES 2" in text and "#define UCCL_EP_HT_COMBINE_STAGES 0" in text
    assert "__CUDA_ARCH__ >= 800" in text
    assert "#define UCCL_EP_HT_COMBINE_UNROLL (UCCL_EP_HT_COMBINE_STAGES ? 4 : 2)" in text


def test_warps_per_peer_follows_the_tuning():
    assert ht_tuning.warps_per_peer(2) == (8, 8)
    assert ht_tuning.warps_per_peer(8) == (2, 2)
    assert ht_tuning.warps_per_peer(2, Tuning(ht_combine_warps=24)) == (8, 12)
    assert ht_tuning.warps_per_peer(8, Tuning(ht_combine_warps=24)) == (2, 3)
    assert ht_tuning.warps_per_peer(4, Tuning(ht_combine_warps=0)) == (4, 4)  # 0: as dispatch
    with pytest.raises(InvalidArgument, match="tuning.ht_warps"):
        ht_tuning.warps_per_peer(9, Tuning(ht_warps=8))


def test_ranks_must_agree_on_block_sizes():
    ht_tuning.check_same_block_sizes([(8, 12), (8, 12)])
    with pytest.raises(InvalidArgument) as e:
        ht_tuning.check_same_block_sizes([(8, 12), (8, 8)])
    assert "rank 1: 8/8" in str(e.value) and "tuning.ht_combine_warps" in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        ht_tuning.check_same_block_sizes([(8, 12), "invalid argument `tuning.ht_warps`: expected a value <= 32"])
    assert "rank 1" in str(e.value) and "<= 32" in str(e.value)


class _FakeKernel:
    def __init__(self, source, name, defines):
        self.source, self.name, self.defines = source, name, defines


@pytest.fixture
def fake_loader(monkeypatch):
    calls = []

    def load_kernel(device, source, name, defines=()):
        calls.append((source, name, tuple(defines)))
        return _FakeKernel(source, name, tuple(defines))

    monkeypatch.setattr(ht_tuning, "load_kernel", load_kernel)
    return calls


def test_kernels_load_for_the_block_sizes(fake_loader):
    ks = ht_tuning.load_kernels(0, 4, block_threads=512, combine_threads=768)
    assert fake_loader == [("ht/nvlink/dispatch.cu", "ht_dispatch", ("UCCL_EP_HT_THREADS=512",)),
                           ("ht/nvlink/combine.cu", "ht_combine", ("UCCL_EP_RANKS=4", "UCCL_EP_HT_THREADS=768"))]
    assert {n: k.name for n, k in ks.items()} == {"ht_dispatch": "ht_dispatch", "ht_combine": "ht_combine"}


def test_kernels_take_the_tuning_defines(fake_loader):
    ht_tuning.load_kernels(0, 2, defines="UCCL_EP_HT_PUBLISH_EVERY=8")
    assert fake_loader == [
        ("ht/nvlink/dispatch.cu", "ht_dispatch", ("UCCL_EP_HT_THREADS=512", "UCCL_EP_HT_PUBLISH_EVERY=8")),
        ("ht/nvlink/combine.cu", "ht_combine",
         ("UCCL_EP_RANKS=2", "UCCL_EP_HT_THREADS=512", "UCCL_EP_HT_PUBLISH_EVERY=8"))]


def test_kernels_exist_with_the_packed_struct():
    for (source, kernel), struct in ((ht_tuning.DISPATCH, "HTDispatchParams"), (ht_tuning.COMBINE, "HTCombineParams")):
        text = (jit.kernel_dir() / source).read_text()
        # launch bounds: UCCL_EP_HT_THREADS (ht_tuning.cuh)
        assert re.search(rf'extern "C" __global__ void __launch_bounds__\(kHTThreads, 1\) {re.escape(kernel)}\('
                         rf"const UCCL_GRID_CONSTANT {struct} p\)", text), (source, kernel)
