"""Kernel variants of the cuda executor's normal (HT) dispatch and combine, chosen per process by
``UCCL_EP_HT_VARIANT`` (read when the executor first runs a normal-mode op).

Every variant takes the same parameter structs (kernel_abi.h: HTDispatchParams, HTCombineParams),
produces the same rows and handle, and writes the peer rings the way the default kernels do (slot
layout and per-warp progress counters), so ranks running different variants still interoperate.

- ``default``: intranode_dispatch.cu / intranode_combine.cu, verified bitwise against
  ``uccl_ep.refs`` and measured on 2 x H200 (docs/benchmarks.md, "CUDA backend"). Its block size
  comes from ``UCCL_EP_HT_WARPS`` and its compile-time tuning (ht_tuning.cuh) from
  ``UCCL_EP_HT_DEFINES``.
- ``tma``: intranode_dispatch_tma.cu / intranode_combine_tma.cu: rows move by bulk copies
  (cp.async.bulk) through per-warp shared-memory stages, progress is published without draining
  the copy pipeline, and tokens a rank keeps skip its own ring. sm_90+ only. Compiled, not yet run.
- ``tma-wide``: the same sources with fewer, larger copies (4 KiB chunks, 3 stages) and half as
  many progress publications. Compiled, not yet run.

docs/benchmarks.md ("HT kernel variants") says what each is expected to change and how the next
GPU session compares them (tools/lab/run_device.sh, step ``variants``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import env
from ..errors import InvalidArgument, Unsupported
from .runtime import Kernel, device_arch, load_kernel, sm_number

__all__ = ["Variant", "VARIANTS", "selected", "load", "smem_bytes", "tuning_defines", "default_defines", "combine_staging", "combine_smem_bytes",
           "warps_per_peer", "check_same_block_sizes"]

_MAX_SMEM_PER_BLOCK = 227 * 1024  # sm_90 / sm_100 opt-in limit of dynamic shared memory per block


@dataclass(frozen=True)
class Variant:
    name: str
    dispatch: tuple[str, str]          # (source under core/kernels, kernel name)
    combine: tuple[str, str]
    chunk: int = 0                     # bulk variants: UCCL_EP_HT_CHUNK / STAGES / LOOKAHEAD / PUBLISH
    stages: int = 0
    lookahead: int = 0
    publish: int = 0
    min_sm: int = 0                    # lowest compute capability (major * 10 + minor)

    @property
    def bulk(self) -> bool:
        return self.chunk > 0

    def defines(self, num_ranks: int) -> tuple[str, ...]:
        if not self.bulk:
            return ()
        return (f"UCCL_EP_RANKS={num_ranks}", f"UCCL_EP_HT_CHUNK={self.chunk}", f"UCCL_EP_HT_STAGES={self.stages}",
                f"UCCL_EP_HT_LOOKAHEAD={self.lookahead}", f"UCCL_EP_HT_PUBLISH={self.publish}")

    def area_bytes(self) -> int:
        """Shared memory per warp: ht_bulk.cuh's kStreamAreaBytes (stages, then 28 B of control
        words per stage rounded up to 128)."""
        if not self.bulk:
            return 0
        return self.stages * self.chunk + (self.stages * 28 + 127) // 128 * 128


_BULK = dict(dispatch=("intranode_dispatch_tma.cu", "ht_dispatch_tma"),
             combine=("intranode_combine_tma.cu", "ht_combine_tma"), min_sm=90)

VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("default", ("intranode_dispatch.cu", "ht_dispatch"), ("intranode_combine.cu", "ht_combine")),
    Variant("tma", chunk=2048, stages=6, lookahead=4, publish=8, **_BULK),
    Variant("tma-wide", chunk=4096, stages=3, lookahead=2, publish=16, **_BULK),
)}


def selected() -> Variant:
    return VARIANTS[env.get("UCCL_EP_HT_VARIANT")]


def smem_bytes(variant: Variant, block_threads: int) -> int:
    """Dynamic shared memory of one block: one area per warp (the kernels check it)."""
    return block_threads // 32 * variant.area_bytes()


class _WithSmem:
    """A kernel launched with one shared-memory area per warp (the call sites stay unchanged)."""

    def __init__(self, kernel: Kernel, area: int) -> None:
        self.kernel, self.area, self.name = kernel, area, kernel.name

    def launch(self, grid, block: int, params: bytes, stream: int, smem: int = 0, cooperative: bool = False) -> None:
        smem = max(smem, block // 32 * self.area)
        self.kernel.launch(grid, block, params, stream, smem=smem, cooperative=cooperative)


_DEFINE = re.compile(r"(UCCL_EP_HT_[A-Z0-9_]+)=(-?\d+)$")
_FROM_WARPS = "UCCL_EP_HT_THREADS"  # set from UCCL_EP_HT_WARPS, not through UCCL_EP_HT_DEFINES


def tuning_defines(text: str | None = None) -> tuple[str, ...]:
    """``UCCL_EP_HT_DEFINES`` parsed: NAME=INT items, NAME one of ht_tuning.cuh's UCCL_EP_HT_* macros."""
    text = env.get("UCCL_EP_HT_DEFINES") if text is None else text
    out = []
    for item in text.split():
        m = _DEFINE.match(item)
        if m is None or m.group(1) == _FROM_WARPS:
            raise InvalidArgument("UCCL_EP_HT_DEFINES", "space-separated UCCL_EP_HT_<NAME>=<integer> items "
                                  "(names in ht_tuning.cuh; the block size comes from UCCL_EP_HT_WARPS)", repr(item))
        out.append(item)
    return tuple(out)


def default_defines(num_ranks: int, block_threads: int, tuning: str | None = None) -> tuple[tuple[str, ...], ...]:
    """-D macros of the default variant's (dispatch, combine) builds (also what precompiling uses)."""
    common = (f"UCCL_EP_HT_THREADS={block_threads}",) + tuning_defines(tuning)
    return common, (f"UCCL_EP_RANKS={num_ranks}",) + common


def warps_per_peer(num_ranks: int) -> tuple[int, int]:
    """(dispatch, combine) warps per peer rank of the normal-mode intranode kernels, from
    UCCL_EP_HT_WARPS / UCCL_EP_HT_COMBINE_WARPS and the selected variant. Both kernels of a ring
    pair wait on the other rank's per-warp counters, so every rank of a group must get the same pair
    (the cuda executor checks it when the Buffer is built)."""
    warps = env.get("UCCL_EP_HT_WARPS")
    combine_warps = env.get("UCCL_EP_HT_COMBINE_WARPS") or warps
    if selected().bulk and not env.is_set("UCCL_EP_HT_COMBINE_WARPS"):
        combine_warps = warps  # the bulk variants run one block size (16 warps); an explicit other one is refused
    for name, n in (("UCCL_EP_HT_WARPS", warps), ("UCCL_EP_HT_COMBINE_WARPS", combine_warps)):
        if n < num_ranks:
            raise InvalidArgument(name, f">= the number of ranks ({num_ranks})", n)
    return warps // num_ranks, combine_warps // num_ranks


def check_same_block_sizes(per_rank: list) -> None:
    """Raise on every rank alike when the ranks' warps_per_peer() answers (or errors, as text) differ."""
    errors = [(r, v) for r, v in enumerate(per_rank) if isinstance(v, str)]
    if errors:
        r, text = errors[0]
        raise InvalidArgument("UCCL_EP_HT_WARPS / UCCL_EP_HT_COMBINE_WARPS", "valid settings on every rank",
                              f"rank {r}: {text}")
    if len(set(per_rank)) > 1:
        listing = ", ".join(f"rank {r}: {d}/{c}" for r, (d, c) in enumerate(per_rank))
        raise InvalidArgument("UCCL_EP_HT_WARPS / UCCL_EP_HT_COMBINE_WARPS", "the same warps per peer on every rank",
                              f"dispatch/combine {listing}", hint="set both variables alike for every process")


def combine_staging(tuning: str | None = None, sm: int = 90) -> tuple[int, int]:
    """(stages, unroll) of the default combine kernel's sum, as ht_tuning.cuh resolves them: from
    UCCL_EP_HT_DEFINES where set, else 2 cp.async stages of 4 vectors on sm_80+ (``sm``: the build's
    compute capability x 10) and the register pipeline (0 stages, unroll 2) before."""
    values = dict(d.split("=") for d in tuning_defines(tuning))
    stages = int(values.get("UCCL_EP_HT_COMBINE_STAGES", 2 if sm >= 80 else 0))
    if stages != 0 and stages < 2:
        raise InvalidArgument("UCCL_EP_HT_DEFINES", "UCCL_EP_HT_COMBINE_STAGES 0 or >= 2", stages)
    return stages, int(values.get("UCCL_EP_HT_COMBINE_UNROLL", 4 if stages else 2))


def combine_smem_bytes(block_threads: int, tuning: str | None = None, sm: int = 90) -> int:
    """Dynamic shared memory of the default combine kernel: with cp.async stages (combine_staging), one
    stage area per warp (combine_sum.cuh: kCombineStageVecs = stages x 2 sources x unroll x 32
    lanes x 16 bytes); 0 otherwise."""
    stages, unroll = combine_staging(tuning, sm)
    if stages == 0:
        return 0
    need = block_threads // 32 * stages * 2 * unroll * 32 * 16
    if need > _MAX_SMEM_PER_BLOCK:
        raise InvalidArgument("UCCL_EP_HT_COMBINE_WARPS / UCCL_EP_HT_DEFINES",
                              f"combine stage areas within {_MAX_SMEM_PER_BLOCK} bytes of shared memory per "
                              f"block ({block_threads // 32} warps x {stages} stages x unroll {unroll} x 1 KiB)",
                              need, hint="fewer combine warps, or UCCL_EP_HT_DEFINES with a smaller "
                              "UCCL_EP_HT_COMBINE_UNROLL / UCCL_EP_HT_COMBINE_STAGES (0: no staging)")
    return need


def load(device: int, num_ranks: int, variant: Variant | None = None, block_threads: int = 512,
         combine_threads: int = 0) -> dict[str, object]:
    """The dispatch and combine kernels of ``variant`` (default: the selected one), keyed
    ``ht_dispatch`` and ``ht_combine`` as NormalEngine launches them, for blocks of
    ``block_threads`` (combine: ``combine_threads`` if set). The default variant only; the bulk
    variants are built for 512."""
    v = variant or selected()
    combine_threads = combine_threads or block_threads
    if not v.bulk:
        d_defs = default_defines(num_ranks, block_threads)[0]
        c_defs = default_defines(num_ranks, combine_threads)[1]
        return {"ht_dispatch": load_kernel(device, *v.dispatch, defines=d_defs),
                "ht_combine": load_kernel(device, *v.combine, defines=c_defs)}
    if block_threads != 512 or combine_threads != 512:
        raise Unsupported(f"UCCL_EP_HT_VARIANT={v.name} runs 16 warps per block; UCCL_EP_HT_WARPS="
                          f"{block_threads // 32} applies to the default variant only")
    arch = device_arch(device)
    if sm_number(arch) < v.min_sm:
        raise Unsupported(f"UCCL_EP_HT_VARIANT={v.name} uses bulk copies (cp.async.bulk), which need compute "
                          f"capability {v.min_sm // 10}.{v.min_sm % 10} or newer; this GPU builds for {arch}. "
                          "Use UCCL_EP_HT_VARIANT=default")
    if smem_bytes(v, 512) > _MAX_SMEM_PER_BLOCK:
        raise Unsupported(f"UCCL_EP_HT_VARIANT={v.name}: {smem_bytes(v, 512)} bytes of shared memory per block "
                          f"exceed {_MAX_SMEM_PER_BLOCK}")
    defs = v.defines(num_ranks)
    return {"ht_dispatch": _WithSmem(load_kernel(device, *v.dispatch, defines=defs), v.area_bytes()),
            "ht_combine": _WithSmem(load_kernel(device, *v.combine, defines=defs), v.area_bytes())}
