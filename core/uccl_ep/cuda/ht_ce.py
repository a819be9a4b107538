"""Intranode combine with the copy engines moving the rows (UCCL_EP_HT_COMBINE_CE).

At EP R a rank's combine input holds, per source rank j, one contiguous run of rows (j's tokens,
in j's order: the dispatch layout), so returning them is R - 1 plain copies. This module keeps a
staging buffer per rank (IPC-shared between the ranks of the host; layout in kernel_abi.h, the
kCE* constants) and runs a combine as:

  current stream: ht_combine_ce_begin (epoch += 1; wait until each peer freed our previous rows)
  side stream per peer j: copy engine: our x rows from j -> j's staging region for us (first the
      top-k weights, then the rows in chunks of chunk_rows, each chunk followed by an 8-byte copy
      of our epoch into j's flags[me][chunk])
  current stream: ht_combine_ce (every block sums: own rows from x, peers' rows from our staging
      once their chunk flag reached the epoch); then the side streams are joined.

Whether a handle's combine takes this path is decided in the (non-cached) dispatch from the R x R
token counts every rank reads from its notify kernel, so every rank decides alike; the staging
buffer grows there too (a collective: the counts are the same everywhere, so every rank grows it
in the same call). A handle from a num_worst_tokens dispatch (no host counts) keeps the ring combine.
"""

from __future__ import annotations

import struct

import torch
import torch.distributed as dist

from .. import env
from ..errors import InvalidArgument
from .runtime import DeviceMemory, load_kernel, pack_params

__all__ = ["CopyEngineCombine", "staging_rows_needed", "region_slot", "region_bytes", "chunk_rows", "copy_list",
           "shared_settings", "check_same_settings"]

# kernel_abi.h (kCE*); a CPU test checks these against the header
MAX_CHUNKS = 128
FLAGS_OFF = 0
FREED_OFF = 8 * 8 * MAX_CHUNKS
EPOCH_OFF = FREED_OFF + 8 * 8
EPOCH_SRC_OFF = EPOCH_OFF + 64
DONE_OFF = EPOCH_SRC_OFF + 64
DATA_OFF = 64 * 1024
_CHUNK_BYTES = 4 << 20   # ~4 MiB of rows per copy: a flag per chunk lets the sums start early
_CAP_STEP = 512          # staging rows are grown in steps of this many


def shared_settings() -> tuple:
    """What every rank must agree on (the executor gathers and compares it at Buffer build)."""
    return bool(env.get("UCCL_EP_HT_COMBINE_CE")), int(env.get("UCCL_EP_HT_COMBINE_CE_MAX_MB"))


def check_same_settings(per_rank: list) -> None:
    if len(set(per_rank)) > 1:
        listing = ", ".join(f"rank {r}: {v[0]:d}/{v[1]}" for r, v in enumerate(per_rank))
        raise InvalidArgument("UCCL_EP_HT_COMBINE_CE / UCCL_EP_HT_COMBINE_CE_MAX_MB", "the same values on every rank",
                              listing, hint="set both variables alike for every process")


def staging_rows_needed(counts: list[list[int]]) -> int:
    """Rows of the largest staging region: max over ordered pairs i != j of rank i's tokens sent to
    rank j (what j returns to i in combine)."""
    R = len(counts)
    return max((counts[i][j] for i in range(R) for j in range(R) if i != j), default=0)


def region_slot(src: int, rcv: int) -> int:
    """Index of source ``src``'s region in rank ``rcv``'s staging buffer (kernel_abi.h ce_region_slot)."""
    return src - (1 if src > rcv else 0)


def region_bytes(cap_rows: int, hidden: int, topk: int) -> int:
    """Bytes of one source's staging region: rows (BF16), then top-k weights (fp32); 4 KiB aligned."""
    return (cap_rows * hidden * 2 + cap_rows * topk * 4 + 4095) // 4096 * 4096


def chunk_rows(cap_rows: int, hidden: int) -> int:
    """Rows per copy-engine chunk: ~4 MiB, and at most MAX_CHUNKS chunks per region."""
    return max(1, _CHUNK_BYTES // (hidden * 2), -(-cap_rows // MAX_CHUNKS))


def copy_list(rank: int, recv_counts: list[int], x_ptr: int, w_ptr: int, hidden: int, topk: int,
              peer_stage: list[int], region: int, cap_rows: int, chunk: int, epoch_src: int) -> dict[int, list]:
    """Per peer j, the (dst, src, bytes) copies that return this rank's x rows from j (and their
    top-k weights when ``w_ptr``) into j's staging region for this rank, each chunk of rows
    followed by its flag (8 bytes of ``epoch_src``). ``recv_counts[j]``: rows this rank got from j."""
    out: dict[int, list] = {}
    start = 0
    row = hidden * 2
    for j, n in enumerate(recv_counts):
        if j != rank and n > 0:
            dst = peer_stage[j] + DATA_OFF + region_slot(rank, j) * region
            ops = []
            if w_ptr:
                ops.append((dst + cap_rows * row, w_ptr + start * topk * 4, n * topk * 4))
            for k, r0 in enumerate(range(0, n, chunk)):
                r1 = min(n, r0 + chunk)
                ops.append((dst + r0 * row, x_ptr + (start + r0) * row, (r1 - r0) * row))
                ops.append((peer_stage[j] + FLAGS_OFF + 8 * (rank * MAX_CHUNKS + k), epoch_src, 8))
            out[j] = ops
        start += n
    return out


class CopyEngineCombine:
    """The staging buffer and launches of the copy-engine combine for one NormalEngine."""

    def __init__(self, engine) -> None:
        self.engine, self.ex = engine, engine.ex
        self.dev, self.R, self.rank = engine.dev, engine.R, engine.rank
        self.enabled = bool(env.get("UCCL_EP_HT_COMBINE_CE")) and self.R > 1
        self.max_bytes = int(env.get("UCCL_EP_HT_COMBINE_CE_MAX_MB")) << 20
        self.mem: DeviceMemory | None = None
        self.cap = self.hidden = self.topk = 0
        self.peer_table = DeviceMemory(self.dev, 8 * self.R) if self.enabled else None
        self.peer_stage: list[int] = []
        self._k = None
        self._streams: list | None = None

    # -- decided in dispatch (collective when the buffer grows) -------------------------------------
    def prepare(self, counts: list[list[int]], hidden: int, topk: int) -> bool:
        """Every rank calls this with the same arguments (the notify kernel's R x R counts, x's
        hidden size, top-k) after a fresh dispatch; True when that handle's combine can take the
        copy engines (the staging buffer is grown first if needed, collectively)."""
        if not self.enabled:
            return False
        need = staging_rows_needed(counts)
        if self.mem is not None and need <= self.cap and hidden == self.hidden and topk <= self.topk:
            return True
        cap = max(self.cap if hidden == self.hidden else 0, -(-max(need, 1) // _CAP_STEP) * _CAP_STEP)
        topk = max(topk, self.topk if hidden == self.hidden else 0)
        total = DATA_OFF + (self.R - 1) * region_bytes(cap, hidden, topk)
        if total > self.max_bytes:
            return False  # the same on every rank: same counts, same limit (checked at build)
        self._establish(cap, hidden, topk, total)
        return True

    def _establish(self, cap: int, hidden: int, topk: int, total: int) -> None:
        drv = self.ex.drv
        torch.cuda.synchronize(self.dev)
        self.ex.host_barrier()  # nobody still reads or writes the old buffers
        if self.mem is not None:
            self.mem.free()
        self.mem = DeviceMemory(self.dev, total)
        drv.memset_d8(self.dev, self.mem.ptr, 0, DATA_OFF, 0)
        drv.synchronize(self.dev)
        handles = [None] * self.R
        dist.all_gather_object(handles, self.mem.ipc_handle(), group=self.ex.ctx.group)
        self.peer_stage = [self.mem.ptr if r == self.rank else self.mem.open_peer(h) for r, h in enumerate(handles)]
        drv.memcpy_htod(self.dev, self.peer_table.ptr, struct.pack(f"<{self.R}Q", *self.peer_stage))
        self.cap, self.hidden, self.topk = cap, hidden, topk
        self.ex.host_barrier()

    # -- combine ------------------------------------------------------------------------------------
    def usable(self, plan, x, topk_weights) -> bool:
        K = topk_weights.shape[1] if topk_weights is not None else 0
        return (getattr(plan, "ce", False) and self.mem is not None and x.shape[1] == self.hidden
                and K <= self.topk and getattr(plan, "recv_counts", None) is not None)

    def _kernels(self):
        if self._k is None:
            from . import ht_variants
            defs = ht_variants.default_defines(self.R, self.engine.combine_block)[1]
            self._k = {n: load_kernel(self.dev, "intranode_combine_ce.cu", n, defs)
                       for n in ("ht_combine_ce_begin", "ht_combine_ce")}
        return self._k

    def combine(self, x, handle, topk_weights, b0, b1, out, out_w, num_sms: int, smem: int) -> None:
        plan, R, H = handle.plan, self.R, x.shape[1]
        K = topk_weights.shape[1] if topk_weights is not None else 0
        k = self._kernels()
        cur = torch.cuda.current_stream(x.device)
        k["ht_combine_ce_begin"].launch(1, 32, pack_params(
            "HTCombineCEBeginParams", stage=self.mem.ptr, error=self.ex.error_dev_ptr, num_ranks=R, rank=self.rank,
            timeout_ns=self.ex.timeout_ns), cur.cuda_stream)
        region = region_bytes(self.cap, self.hidden, self.topk)
        chunk = chunk_rows(self.cap, self.hidden)
        copies = copy_list(self.rank, list(plan.recv_counts), x.data_ptr(),
                           topk_weights.data_ptr() if topk_weights is not None else 0, H, K, self.peer_stage,
                           region, self.cap, chunk, self.mem.ptr + EPOCH_SRC_OFF)
        if self._streams is None:
            self._streams = [torch.cuda.Stream(x.device) for _ in range(R)]
        forked = torch.cuda.Event()
        forked.record(cur)
        joins = []
        for j, ops in copies.items():
            side = self._streams[j]
            side.wait_event(forked)
            self.ex.drv.memcpy_dtod_async_batch(self.dev, side.cuda_stream,
                                                b"".join(struct.pack("<3Q", *op) for op in ops))
            done = torch.cuda.Event()
            done.record(side)
            joins.append(done)
        params = pack_params(
            "HTCombineCEParams", x=x.data_ptr(), topk_weights=topk_weights.data_ptr() if topk_weights is not None else 0,
            bias0=b0.data_ptr() if b0 is not None else 0, bias1=b1.data_ptr() if b1 is not None else 0,
            out=out.data_ptr(), out_weights=out_w.data_ptr() if out_w is not None else 0,
            is_token_in_rank=handle[4].data_ptr(), send_head=handle[5].data_ptr(), channel_prefix=handle[1].data_ptr(),
            recv_channel_prefix=handle[2].data_ptr(), stage=self.mem.ptr, peer_stage=self.peer_table.ptr,
            error=self.ex.error_dev_ptr, num_tokens=plan.num_tokens, hidden=H, num_topk=K, num_ranks=R,
            rank=self.rank, num_channels=plan.num_channels, region_bytes=region, cap_rows=self.cap,
            chunk_rows=chunk, timeout_ns=self.ex.timeout_ns)
        k["ht_combine_ce"].launch(num_sms, self.engine.combine_block, params, cur.cuda_stream, smem=smem)
        for done in joins:
            cur.wait_event(done)

    def free(self) -> None:
        if self.mem is not None:
            self.mem.free()
            self.mem = None
        if self.peer_table is not None:
            self.peer_table.free()
