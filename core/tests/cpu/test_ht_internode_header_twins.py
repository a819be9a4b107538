"""Normal (HT) mode of the CUDA executor through the CPU proxy: the Python twins of
kernel_abi_internode.h (state layout, message layouts, ring and meta slot offsets, counters) and of
the copy role against the headers themselves, compiled by g++; the kernels' publish discipline; the
per-channel counts. The host orchestration and end-to-end runs: test_ht_internode_proxy_path.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from uccl_ep.cuda import ht_proxy, ht_proxy_forward, jit  # noqa: E402
from uccl_ep.cuda import ht_proxy_plan as plan  # noqa: E402
from uccl_ep.host.ht_common import pack_table  # noqa: E402
from uccl_ep.protocol.layout import MetaLayout  # noqa: E402
from uccl_ep.routing import per_channel_counts  # noqa: E402

pytestmark = pytest.mark.cpu

# --------------------------------------------------------------------------------------------------
# 1. the header's twins
# --------------------------------------------------------------------------------------------------
_PROBE = r"""
#include <cstddef>
#include <cstdio>
#include "uccl_ep/kernel_abi_internode.h"
using namespace uccl_ep;
int main() {
  printf("%d %d %d %d %d %d %d\n", kHTProxyMaxRanks, kHTProxyMaxChannels, kHTProxyHeadBase, kHTProxyMetaCounter,
         kHTProxyNumCounters, kHTProxyWarps, (int)sizeof(HTProxyState));
  printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu\n", offsetof(HTProxyState, op), offsetof(HTProxyState, seen),
         offsetof(HTProxyState, send_pos), offsetof(HTProxyState, recv_pos), offsetof(HTProxyState, self_tail),
         offsetof(HTProxyState, self_head), offsetof(HTProxyState, area_geometry), offsetof(HTProxyState, mate_tail),
         offsetof(HTProxyState, mate_head));
  const long long cases[][3] = {{512, 0, 0}, {14336, 0, 8}, {7168, 56, 8}, {384, 3, 5}, {4096, 32, 0}, {16, 1, 1}};
  for (auto& c : cases) {
    HTDispatchMsg m = ht_dispatch_msg(c[0], c[1], c[2]);
    printf("%lld %lld %lld %lld %lld %lld\n", (long long)m.scales, (long long)m.topk, (long long)m.weights,
           (long long)m.src, (long long)m.bytes, (long long)ht_combine_msg_bytes(c[0] / 2, c[2]));
  }
  printf("%llu %llu %llu\n", (unsigned long long)ht_ring_slot(4096, 3, 5, 12, 40, 7, 576),
         (unsigned long long)ht_meta_recv(1 << 20, SLOT, 4, 1, 3), (unsigned long long)ht_meta_send(1 << 20, SLOT, 4, 1, 2));
  return 0;
}
"""


def test_header_twins_agree(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "probe.cc"
    src.write_text(_PROBE.replace("SLOT", str(MetaLayout(0, 4).slot)))
    exe = tmp_path / "probe"
    res = subprocess.run([cxx, "-std=c++17", f"-I{jit.include_dir()}", str(src), "-o", str(exe)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    consts = [int(v) for v in lines[0].split()]
    off = plan.state_offsets()
    assert consts == [plan.MAX_RANKS, plan.MAX_CHANNELS, plan.HEAD_BASE, plan.META_COUNTER0, plan.NUM_COUNTERS, 16,
                      off["bytes"]]
    assert [int(v) for v in lines[1].split()] == [off["op"], off["seen"], off["send_pos"], off["recv_pos"],
                                                  off["self_tail"], off["self_head"], off["area_geometry"],
                                                  off["mate_tail"], off["mate_head"]]
    for line, (hb, ns, k) in zip(lines[2:8], [(512, 0, 0), (14336, 0, 8), (7168, 56, 8), (384, 3, 5), (4096, 32, 0),
                                              (16, 1, 1)]):
        got = [int(v) for v in line.split()]
        assert got[4] == plan.dispatch_msg_bytes(hb, ns, k) and got[5] == plan.combine_msg_bytes(hb // 2, k)
        assert got[:4] == [hb, hb + 4 * ns, hb + 4 * ns + 8 * k, hb + 4 * ns + 12 * k]
    ring, mrecv, msend = (int(v) for v in lines[8].split())
    assert ring == 4096 + ((3 * 12 + 5) * 40 + 7) * 576
    meta = MetaLayout(1 << 20, 4)
    assert mrecv == meta.recv(1, 3) and msend == meta.send(1, 2)


def test_plan_launch_twins_agree():
    """The launch geometry ht_proxy.py and ht_proxy_forward.py use for ht/proxy/plan.cu's kernels is the
    kernels' own (a grid of too few chunks would leave forwarder rows of send_nvl_head unwritten)."""
    text = (jit.kernel_dir() / "ht/proxy/plan.cu").read_text()
    const = {m[0]: int(m[1]) for m in re.findall(r"constexpr int (k\w+) = (\d+);", text)}
    assert const["kPlanThreads"] == ht_proxy._PLAN_BLOCK and const["kMaxLocal"] == plan.MAX_LOCAL
    assert (const["kHandleThreads"], const["kHandleRows"]) == (ht_proxy_forward._HANDLE_BLOCK,
                                                               ht_proxy_forward._HANDLE_ROWS)


_DMA_PROBE = r"""
#include <cstddef>
#include <cstdio>
#include "uccl_ep/dma_ring.h"
using namespace uccl_ep;
int main() {
  printf("%llu %llu %zu %zu %zu %zu %zu\n", (unsigned long long)kDmaRingCapacity, (unsigned long long)kHtDmaUnitCapacity,
         sizeof(HtDmaRing), sizeof(HtDmaContext), offsetof(HtDmaRing, stop), offsetof(HtDmaContext, num_rings),
         offsetof(HtDmaContext, timeout_ns));
  return 0;
}
"""


def test_copy_role_twins_agree(tmp_path):
    """ht_proxy.py's mirrors of dma_ring.h's copy-role ABI (the context it packs, the ring states it
    initialises) against the header."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src, exe = tmp_path / "dma.cc", tmp_path / "dma"
    src.write_text(_DMA_PROBE)
    subprocess.run([cxx, "-std=c++17", f"-I{jit.include_dir()}", str(src), "-o", str(exe)], check=True, timeout=120)
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert got == [ht_proxy.DMA_RING_CAPACITY, ht_proxy.DMA_UNIT_CAPACITY, ht_proxy.DMA_RING_STATE_BYTES,
                   ht_proxy.DMA_CONTEXT_BYTES, 4 * 8, 10 * 8, 13 * 8]


def test_message_layout_is_the_host_executors_packed_row():
    """A dispatch message is exactly the host executor's pack_table row (x | scales | ids | weights | index)."""
    g = torch.Generator().manual_seed(1)
    for H, ns, K in ((256, 2, 4), (128, 1, 3), (512, 0, 0), (384, 3, 5)):
        x = torch.randn(5, H, generator=g).bfloat16()
        cols = [x] + ([torch.rand(5, ns, generator=g)] if ns else []) + \
            ([torch.randint(-1, 9, (5, K), generator=g), torch.rand(5, K, generator=g)] if K else []) + \
            [torch.arange(5, dtype=torch.int32).view(-1, 1)]
        table, msg = pack_table(cols, 5)
        assert msg == plan.dispatch_msg_bytes(2 * H, ns, K)
        y = torch.randn(5, H, generator=g).bfloat16()
        assert pack_table([y] + ([torch.rand(5, K, generator=g)] if K else []), 5)[1] == plan.combine_msg_bytes(H, K)


@pytest.mark.parametrize("source", ["ht/proxy/notify.cu", "ht/proxy/dispatch.cu", "ht/proxy/combine.cu",
                                    "ht/proxy/forward_dispatch.cu", "ht/proxy/forward_combine.cu"])
def test_kernels_publish_with_release_and_never_trap(source, tmp_path):
    """PTX of each proxy-path HT kernel: commands are published by the FIFO's 16-byte release store,
    counters are read with system-scope acquire, and no path ends in a trap (bounded waits fill
    the error word instead)."""
    try:
        nvcc = jit.find_nvcc()
    except Exception:  # noqa: BLE001
        if os.environ.get("CI"):
            pytest.fail("nvcc missing on CI")
        pytest.skip("nvcc not installed")
    out = tmp_path / "k.ptx"
    res = subprocess.run([str(nvcc), "-std=c++17", "-O3", f"-I{jit.include_dir()}", "-ptx", "-arch=sm_90a",
                          str(jit.kernel_dir() / source), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ptx = out.read_text()
    assert "st.release.sys.global.v2.u64" in ptx and "ld.acquire.sys.global.u64" in ptx
    assert "trap" not in ptx


@pytest.mark.parametrize("T", [0, 1, 5, 37, 96])
@pytest.mark.parametrize("channels", [1, 3, 12])
def test_channel_counts_match_the_routing_helper(T, channels):
    mask = torch.rand(T, 5, generator=torch.Generator().manual_seed(T)) < 0.4
    assert torch.equal(plan.channel_counts(mask, channels), per_channel_counts(mask, channels))
