"""UCCL_EP_HT_VARIANT's table and loader (uccl_ep/cuda/ht_variants.py), without a GPU: the default
variant loads exactly the kernels the normal engine always loaded, bulk variants launch with their
shared memory and are refused on GPUs without cp.async.bulk."""

from __future__ import annotations

import re

import pytest

from uccl_ep import env
from uccl_ep.cuda import ht_variants, jit
from uccl_ep.errors import InvalidArgument, Unsupported


class _FakeKernel:
    def __init__(self, source, name, defines):
        self.source, self.name, self.defines, self.launches = source, name, defines, []

    def launch(self, grid, block, params, stream, smem=0, cooperative=False):
        self.launches.append((grid, block, params, stream, smem, cooperative))


@pytest.fixture
def fake_loader(monkeypatch):
    calls = []

    def load_kernel(device, source, name, defines=()):
        calls.append((source, name, tuple(defines)))
        return _FakeKernel(source, name, tuple(defines))

    monkeypatch.setattr(ht_variants, "load_kernel", load_kernel)
    monkeypatch.setattr(ht_variants, "device_arch", lambda device: "sm_90a")
    return calls


def test_env_choices_are_the_variant_table(monkeypatch):
    var = env.REGISTRY["UCCL_EP_HT_VARIANT"]
    assert var.choices == tuple(ht_variants.VARIANTS) and var.default == "default"
    monkeypatch.delenv("UCCL_EP_HT_VARIANT", raising=False)
    assert ht_variants.selected().name == "default"
    monkeypatch.setenv("UCCL_EP_HT_VARIANT", "tma")
    assert ht_variants.selected().name == "tma"
    monkeypatch.setenv("UCCL_EP_HT_VARIANT", "fast")
    with pytest.raises(InvalidArgument):
        ht_variants.selected()


def test_default_variant_loads_its_kernels_for_the_block_sizes(fake_loader, monkeypatch):
    monkeypatch.delenv("UCCL_EP_HT_DEFINES", raising=False)
    ks = ht_variants.load(0, 4, ht_variants.VARIANTS["default"], block_threads=512, combine_threads=768)
    assert fake_loader == [("intranode_dispatch.cu", "ht_dispatch", ("UCCL_EP_HT_THREADS=512",)),
                           ("intranode_combine.cu", "ht_combine", ("UCCL_EP_RANKS=4", "UCCL_EP_HT_THREADS=768"))]
    assert all(isinstance(k, _FakeKernel) for k in ks.values())  # launched as before: no wrapper


def test_default_variant_takes_the_tuning_defines(fake_loader, monkeypatch):
    monkeypatch.setenv("UCCL_EP_HT_DEFINES", "UCCL_EP_HT_PUBLISH_EVERY=8")
    ht_variants.load(0, 2, ht_variants.VARIANTS["default"])
    assert fake_loader == [
        ("intranode_dispatch.cu", "ht_dispatch", ("UCCL_EP_HT_THREADS=512", "UCCL_EP_HT_PUBLISH_EVERY=8")),
        ("intranode_combine.cu", "ht_combine", ("UCCL_EP_RANKS=2", "UCCL_EP_HT_THREADS=512", "UCCL_EP_HT_PUBLISH_EVERY=8"))]


def test_bulk_variants_refuse_other_block_sizes(fake_loader):
    with pytest.raises(Unsupported, match="UCCL_EP_HT_WARPS"):
        ht_variants.load(0, 2, ht_variants.VARIANTS["tma"], block_threads=512, combine_threads=768)
    assert fake_loader == []


@pytest.mark.parametrize("name", [n for n, v in ht_variants.VARIANTS.items() if v.bulk])
def test_bulk_variant_launches_with_one_area_per_warp(fake_loader, name):
    v = ht_variants.VARIANTS[name]
    ks = ht_variants.load(0, 2, v)
    assert {c[0] for c in fake_loader} == {v.dispatch[0], v.combine[0]}
    assert all(c[2] == v.defines(2) for c in fake_loader)
    assert f"UCCL_EP_HT_CHUNK={v.chunk}" in v.defines(2) and "UCCL_EP_RANKS=2" in v.defines(2)
    ks["ht_dispatch"].launch(24, 512, b"p", 7)
    ks["ht_combine"].launch(24, 512, b"q", 7)
    assert ks["ht_dispatch"].kernel.launches == [(24, 512, b"p", 7, 16 * v.area_bytes(), False)]
    assert ks["ht_combine"].kernel.launches[0][4] == ht_variants.smem_bytes(v, 512) <= 227 * 1024


def test_bulk_variant_is_refused_before_sm90(monkeypatch, fake_loader):
    monkeypatch.setattr(ht_variants, "device_arch", lambda device: "sm_80")
    with pytest.raises(Unsupported, match=r"cp\.async\.bulk.*sm_80.*UCCL_EP_HT_VARIANT=default"):
        ht_variants.load(0, 2, ht_variants.VARIANTS["tma"])
    assert fake_loader == []


@pytest.mark.parametrize("name", list(ht_variants.VARIANTS))
def test_variant_kernels_exist_with_the_packed_struct(name):
    v = ht_variants.VARIANTS[name]
    for (source, kernel), struct in ((v.dispatch, "HTDispatchParams"), (v.combine, "HTCombineParams")):
        text = (jit.kernel_dir() / source).read_text()
        bounds = r"kHTThreads" if name == "default" else r"512"  # default: UCCL_EP_HT_THREADS (ht_tuning.cuh)
        assert re.search(rf'extern "C" __global__ void __launch_bounds__\({bounds}, 1\) {re.escape(kernel)}\('
                         rf"const UCCL_GRID_CONSTANT {struct} p\)", text), (source, kernel)

