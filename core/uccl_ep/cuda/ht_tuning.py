"""Build settings of the cuda executor's normal-mode (HT) intranode kernels (ht/nvlink/dispatch.cu,
ht/nvlink/combine.cu, and the copy-engine kernels built alike): block sizes from
``Tuning.ht_warps`` / ``Tuning.ht_combine_warps``, compile-time tuning from ``Tuning.ht_defines``
(the ``UCCL_EP_HT_*`` macros of kernels/include/uccl_ep/device/ht_tuning.cuh), and the shared
memory of the combine's cp.async stages, which Python sizes the way the header resolves them.
"""

from __future__ import annotations

import re

from ..tuning import DEFAULT as DEFAULT_TUNING, Tuning
from ..errors import InvalidArgument
from .runtime import load_kernel

__all__ = ["tuning_defines", "kernel_defines", "load_kernels", "warps_per_peer", "check_same_block_sizes",
           "combine_staging", "combine_smem_bytes"]

_MAX_SMEM_PER_BLOCK = 227 * 1024  # sm_90 / sm_100 opt-in limit of dynamic shared memory per block
DISPATCH = ("ht/nvlink/dispatch.cu", "ht_dispatch")  # (source under core/kernels, kernel name)
COMBINE = ("ht/nvlink/combine.cu", "ht_combine")

_DEFINE = re.compile(r"(UCCL_EP_HT_[A-Z0-9_]+)=(-?\d+)$")
_FROM_WARPS = "UCCL_EP_HT_THREADS"  # set from Tuning.ht_warps, not through Tuning.ht_defines


def tuning_defines(text: str | None = None) -> tuple[str, ...]:
    """``Tuning.ht_defines`` parsed: NAME=INT items, NAME one of ht_tuning.cuh's UCCL_EP_HT_* macros."""
    text = text or ""
    out = []
    for item in text.split():
        m = _DEFINE.match(item)
        if m is None or m.group(1) == _FROM_WARPS:
            raise InvalidArgument("tuning.ht_defines", "space-separated UCCL_EP_HT_<NAME>=<integer> items "
                                  "(names in ht_tuning.cuh; the block size comes from tuning.ht_warps)", repr(item))
        out.append(item)
    return tuple(out)


def kernel_defines(num_ranks: int, block_threads: int, tuning: str | None = None) -> tuple[tuple[str, ...], ...]:
    """-D macros of the (dispatch, combine) builds for blocks of ``block_threads`` (also what
    precompiling uses; the copy-engine kernels take the combine's)."""
    common = (f"UCCL_EP_HT_THREADS={block_threads}",) + tuning_defines(tuning)
    return common, (f"UCCL_EP_RANKS={num_ranks}",) + common


def load_kernels(device: int, num_ranks: int, block_threads: int = 512, combine_threads: int = 0,
                 defines: str = "") -> dict[str, object]:
    """The dispatch and combine kernels, keyed ``ht_dispatch`` and ``ht_combine`` as NormalEngine
    launches them, for blocks of ``block_threads`` (combine: ``combine_threads`` if set)."""
    combine_threads = combine_threads or block_threads
    d_defs = kernel_defines(num_ranks, block_threads, defines)[0]
    c_defs = kernel_defines(num_ranks, combine_threads, defines)[1]
    return {"ht_dispatch": load_kernel(device, *DISPATCH, defines=d_defs),
            "ht_combine": load_kernel(device, *COMBINE, defines=c_defs)}


def warps_per_peer(num_ranks: int, tuning: Tuning = DEFAULT_TUNING) -> tuple[int, int]:
    """(dispatch, combine) warps per peer rank of the normal-mode intranode kernels, from
    Tuning.ht_warps / Tuning.ht_combine_warps. Both kernels of a ring pair wait on the other
    rank's per-warp counters, so every rank of a group must get the same pair (the cuda executor
    checks it when the Buffer is built)."""
    warps = tuning.ht_warps
    combine_warps = tuning.ht_combine_warps or warps
    for name, n in (("tuning.ht_warps", warps), ("tuning.ht_combine_warps", combine_warps)):
        if n < num_ranks:
            raise InvalidArgument(name, f">= the number of ranks ({num_ranks})", n)
    return warps // num_ranks, combine_warps // num_ranks


def check_same_block_sizes(per_rank: list) -> None:
    """Raise on every rank alike when the ranks' warps_per_peer() answers (or errors, as text) differ."""
    errors = [(r, v) for r, v in enumerate(per_rank) if isinstance(v, str)]
    if errors:
        r, text = errors[0]
        raise InvalidArgument("tuning.ht_warps / tuning.ht_combine_warps", "valid settings on every rank",
                              f"rank {r}: {text}")
    if len(set(per_rank)) > 1:
        listing = ", ".join(f"rank {r}: {d}/{c}" for r, (d, c) in enumerate(per_rank))
        raise InvalidArgument("tuning.ht_warps / tuning.ht_combine_warps", "the same warps per peer on every rank",
                              f"dispatch/combine {listing}", hint="pass the same Tuning to every rank's Buffer")


def combine_staging(tuning: str | None = None, sm: int = 90) -> tuple[int, int]:
    """(stages, unroll) of the combine kernel's sum, as ht_tuning.cuh resolves them: from
    Tuning.ht_defines where set, else 2 cp.async stages of 4 vectors on sm_80+ (``sm``: the build's
    compute capability x 10) and the register pipeline (0 stages, unroll 2) before."""
    values = dict(d.split("=") for d in tuning_defines(tuning))
    stages = int(values.get("UCCL_EP_HT_COMBINE_STAGES", 2 if sm >= 80 else 0))
    if stages != 0 and stages < 2:
        raise InvalidArgument("tuning.ht_defines", "UCCL_EP_HT_COMBINE_STAGES 0 or >= 2", stages)
    return stages, int(values.get("UCCL_EP_HT_COMBINE_UNROLL", 4 if stages else 2))


def combine_smem_bytes(block_threads: int, tuning: str | None = None, sm: int = 90) -> int:
    """Dynamic shared memory of the combine kernel: with cp.async stages (combine_staging), one
    stage area per warp (combine_sum.cuh: kCombineStageVecs = stages x 2 sources x unroll x 32
    lanes x 16 bytes); 0 otherwise."""
    stages, unroll = combine_staging(tuning, sm)
    if stages == 0:
        return 0
    need = block_threads // 32 * stages * 2 * unroll * 32 * 16
    if need > _MAX_SMEM_PER_BLOCK:
        raise InvalidArgument("tuning.ht_combine_warps / tuning.ht_defines",
                              f"combine stage areas within {_MAX_SMEM_PER_BLOCK} bytes of shared memory per "
                              f"block ({block_threads // 32} warps x {stages} stages x unroll {unroll} x 1 KiB)",
                              need, hint="fewer combine warps, or tuning.ht_defines with a smaller "
                              "UCCL_EP_HT_COMBINE_UNROLL / UCCL_EP_HT_COMBINE_STAGES (0: no staging)")
    return need
