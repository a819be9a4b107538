"""Intranode HT ops with the copy engines moving rows (Tuning.ht_combine_ce, Tuning.ht_dispatch_ce).

At EP R a rank's combine input holds, per source rank j, one contiguous run of rows (j's tokens,
in j's order: the dispatch layout), so returning them is R - 1 plain copies. This module keeps a
staging buffer per rank (IPC-shared between the ranks of the host; layout in kernel_abi.h, the
kCE* / kCED* constants) and runs a combine as:

  current stream: ht_ce_begin (epoch += 1; wait until each peer freed our previous rows)
  side stream per peer j: copy engine: our x rows from j -> j's staging region for us (first the
      top-k weights, then the rows in chunks of chunk_rows, each chunk followed by an 8-byte copy
      of our epoch into j's flags[me][chunk])
  current stream: ht_combine_ce (every block sums: own rows from x, peers' rows from our staging
      once their chunk flag reached the epoch); then the side streams are joined.

The dispatch (an experiment, off by default) mirrors it: ht_dispatch_ce writes own rows into
recv_x and each peer's rows (with metadata) into the peer's dispatch region, raising a flag per
completed chunk; each source's copy stream here runs ht_ce_wait (bounded) + a copy per chunk into
recv_x (receive_chain, issued by one native call), then hands the region back (freed).

Whether a handle takes these paths is decided in the (non-cached) dispatch from the R x R token
counts every rank reads from its notify kernel, so every rank decides alike; the staging buffer
grows there too (a collective: the counts are the same everywhere, so every rank grows it in the
same call). A handle from a num_worst_tokens dispatch (no host counts) keeps the ring kernels.
"""

from __future__ import annotations

import struct
import warnings

import torch
import torch.distributed as dist

from ..tuning import DEFAULT as DEFAULT_TUNING, Tuning, require_same_across_ranks
from ..tuning import shared_values as tuning_shared_values
from .runtime import DeviceMemory, ParamCache, load_kernel, pack_params, tensor_ptr

__all__ = ["CopyEngineOps", "staging_rows_needed", "region_slot", "region_bytes", "chunk_rows", "copy_list",
           "dispatch_layout", "receive_chain",
           "shared_settings", "check_same_settings"]

# kernel_abi.h (kCE*); a CPU test checks these against the header
MAX_CHUNKS = 128
FLAGS_OFF = 0
FREED_OFF = 8 * 8 * MAX_CHUNKS
EPOCH_OFF = FREED_OFF + 8 * 8
EPOCH_SRC_OFF = EPOCH_OFF + 64
DONE_OFF = EPOCH_SRC_OFF + 64
WARM_OFF = DONE_OFF + 64     # 8 scratch bytes a peer's warm-up copy writes (no kernel reads them)
DATA_OFF = 64 * 1024
D_FLAGS_OFF = 16 * 1024      # dispatch (kCED*)
D_FREED_OFF = 24 * 1024
D_EPOCH_OFF = D_FREED_OFF + 8 * 8
D_EPOCH_SRC_OFF = D_EPOCH_OFF + 64
D_COUNT_OFF = 32 * 1024
_PHASE_HT_DISPATCH_SEND, _PHASE_HT_COMBINE_SEND = 4, 6   # kernel_abi.h kPhase*
_CAP_STEP = 512          # staging rows are grown in steps of this many
# The kernels' parameters: the per-call tensor pointers, then every other field (runtime.ParamCache)
BEGIN_FIXED = ("stage", "error", "epoch_off", "epoch_src_off", "freed_off", "phase", "num_ranks", "rank", "timeout_ns")
COMBINE_POINTERS = ("x", "topk_weights", "bias0", "bias1", "out", "out_weights", "is_token_in_rank", "send_head",
                    "channel_prefix", "recv_channel_prefix")
COMBINE_FIXED = ("stage", "peer_stage", "error", "num_tokens", "hidden", "num_topk", "num_ranks", "rank", "num_channels",
                 "region_bytes", "cap_rows", "chunk_rows", "timeout_ns")
# NOTES: Tuning.ht_dispatch_ce=auto takes the copy engines for calls with at most this many SMs:
# there the SMs' two copies per row bound the ring dispatch, while with more SMs the ring is faster
# (and FP8 by copy engines slower still); the EP2 measurements are in docs/benchmarks.md.
AUTO_DISPATCH_MAX_SMS = 12


SHARED_SETTINGS = ("ht_combine_ce", "ht_combine_ce_max_mb", "ht_ce_min_mb", "ht_dispatch_ce", "ht_ce_chunk_kb",
                   "ht_defines")


def shared_settings(tuning: Tuning = DEFAULT_TUNING) -> tuple:
    """What every rank must agree on (Tuning fields; the executor gathers and compares them at Buffer build)."""
    return tuning_shared_values(tuning, SHARED_SETTINGS)


def check_same_settings(per_rank: list) -> None:
    require_same_across_ranks(SHARED_SETTINGS, per_rank, "every rank decides the copy-engine paths alike")


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


def chunk_rows(cap_rows: int, hidden: int, row_bytes: int | None = None, *, chunk_bytes: int) -> int:
    """Rows per copy-engine chunk: ~chunk_bytes (Tuning.ht_ce_chunk_kb; a flag per chunk lets the
    receiver start early), and at most MAX_CHUNKS chunks per region."""
    return max(1, chunk_bytes // (row_bytes or hidden * 2), -(-cap_rows // MAX_CHUNKS))


def _a16(n: int) -> int:
    return (n + 15) // 16 * 16


def dispatch_layout(cap_rows: int, hidden_bytes: int, num_scales: int, topk: int) -> dict:
    """One source's dispatch region (kernel params of HTDispatchCEParams): rows, scales (fp32 or
    int32, row-major), top-k ids (int64), weights (fp32), source index (int32); 4 KiB aligned."""
    scales = _a16(cap_rows * hidden_bytes)
    ids = _a16(scales + cap_rows * num_scales * 4)
    weights = _a16(ids + cap_rows * topk * 8)
    src = _a16(weights + cap_rows * topk * 4)
    total = (src + cap_rows * 4 + 4095) // 4096 * 4096
    return {"scales_off": scales, "topk_off": ids, "weights_off": weights, "src_off": src, "bytes": total}


def receive_chain(rank: int, recv_counts: list[int], stage: int, peer_stage: list[int], d_base: int, d_region: int,
                  lay: dict, chunk: int, hidden_bytes: int, num_scales: int, topk: int, outs: dict, error: int,
                  timeout_ns: int) -> dict[int, tuple[list[list], list]]:
    """Per source j != rank, the steps (ce_chain records) that move j's rows into recv_x, as
    (chunks, tail): chunks[k] = a bounded wait for j's flag of chunk k, then the chunk's copy into
    recv_x; the tail, after every chunk: the scales and, in a fresh dispatch (``outs`` has them),
    top-k ids, weights and source indices, then this rank's epoch into j's freed[rank] (j may
    overwrite the region next time). ``outs``: pointers of recv_x and the other outputs (0 when
    absent)."""
    chains: dict[int, tuple[list[list], list]] = {}
    meta = (("recv_scales", "scales_off", num_scales * 4), ("recv_topk_idx", "topk_off", topk * 8),
            ("recv_topk_weights", "weights_off", topk * 4), ("recv_src_idx", "src_off", 4))
    start = 0
    for j, n in enumerate(recv_counts):
        if j == rank:
            start += n
            continue
        region = stage + d_base + region_slot(j, rank) * d_region
        chunks: list[list] = []
        for k, r0 in enumerate(range(0, n, chunk)):
            r1 = min(n, r0 + chunk)
            flag = stage + D_FLAGS_OFF + 8 * (j * MAX_CHUNKS + k)
            chunks.append([(1, 0, 0, 0, flag, stage, error, D_EPOCH_OFF, rank, j, k, timeout_ns),
                           (0, outs["recv_x"] + (start + r0) * hidden_bytes, region + r0 * hidden_bytes,
                            (r1 - r0) * hidden_bytes) + (0,) * 8])
        tail = []
        if n > 0:
            for key, off, width in meta:
                if outs.get(key) and width:
                    tail.append((0, outs[key] + start * width, region + lay[off], n * width) + (0,) * 8)
        tail.append((0, peer_stage[j] + D_FREED_OFF + 8 * rank, stage + D_EPOCH_SRC_OFF, 8) + (0,) * 8)
        chains[j] = (chunks, tail)
        start += n
    return chains


def copy_list(rank: int, recv_counts: list[int], x_ptr: int, w_ptr: int, hidden: int, topk: int,
              peer_stage: list[int], region: int, cap_rows: int, chunk: int, epoch_src: int) -> dict[int, list]:
    """Per peer j, the (dst, src, bytes) copies that return this rank's x rows from j (and their
    top-k weights when ``w_ptr``) into j's staging region for this rank: the weights first, then
    the rows in chunks, each chunk followed by its flag (8 bytes of ``epoch_src``).
    ``recv_counts[j]``: rows this rank got from j."""
    out: dict[int, list] = {}
    start = 0
    row = hidden * 2
    for j, n in enumerate(recv_counts):
        if j != rank and n > 0:
            dst = peer_stage[j] + DATA_OFF + region_slot(rank, j) * region
            ops = [(dst + cap_rows * row, w_ptr + start * topk * 4, n * topk * 4)] if w_ptr else []
            for k, r0 in enumerate(range(0, n, chunk)):
                r1 = min(n, r0 + chunk)
                ops.append((dst + r0 * row, x_ptr + (start + r0) * row, (r1 - r0) * row))
                ops.append((peer_stage[j] + FLAGS_OFF + 8 * (rank * MAX_CHUNKS + k), epoch_src, 8))
            out[j] = ops
        start += n
    return out


class CopyEngineOps:
    """The staging buffer and launches of the copy-engine combine (and dispatch) for one NormalEngine."""

    def __init__(self, engine) -> None:
        self.engine, self.ec = engine, engine.ec
        self.dev, self.R, self.rank = engine.dev, engine.R, engine.rank
        tuning = engine.ec.ctx.tuning
        self.enabled = tuning.ht_combine_ce and self.R > 1
        # "1" / "auto" (calls with <= AUTO_DISPATCH_MAX_SMS SMs) / "0"
        self.dispatch_mode = tuning.ht_dispatch_ce if self.enabled else "0"
        self.dispatch_enabled = self.dispatch_mode != "0"
        self.c_region = self.d_region = 0
        self.max_bytes = tuning.ht_combine_ce_max_mb << 20
        self.min_bytes = tuning.ht_ce_min_mb << 20
        self.mem: DeviceMemory | None = None
        self.cap = self.hidden = self.topk = 0
        self.peer_table = DeviceMemory(self.dev, 8 * self.R) if self.enabled else None
        self.peer_stage: list[int] = []
        self._k = None
        self._streams: dict = {}  # peer -> torch.cuda.Stream (its copy stream)
        # NOTES: one fork event and one done event per copy stream, recorded again every call: a
        # stream's wait takes the event's latest record at the time it is enqueued, so reuse is safe,
        # and creating and destroying CUDA events costs host time on every op
        self._fork_event = None
        self._done_events: dict = {}  # peer -> torch.cuda.Event (after its copy stream's last call)
        self._begin_params = ParamCache("HTCEBeginParams", (), BEGIN_FIXED)
        self._combine_params = ParamCache("HTCombineCEParams", COMBINE_POINTERS, COMBINE_FIXED)
        self._pack_cache: dict = {}  # see _packed
        self.chunk_bytes = tuning.ht_ce_chunk_kb << 10
        self.defines = tuning.ht_defines
        self.dispatches = 0  # copy-engine dispatches run (tests check the path was taken)
        if self.enabled:
            self._kernels()  # compiled / loaded with the engine, before the constructor's barrier

    # -- decided in dispatch (collective when the buffer grows) -------------------------------------
    def wants_dispatch(self, num_sms: int) -> bool:
        """Whether a call with this Config's SM count dispatches by copy engines (Tuning.ht_dispatch_ce)."""
        # NOTES: auto is limited to EP2, where it was measured and verified; at EP4 / EP8 the ring
        # dispatch stays the default until the copy-engine dispatch is run there (=1 opts in).
        return self.dispatch_mode == "1" or (self.dispatch_mode == "auto" and self.R == 2
                                             and num_sms <= AUTO_DISPATCH_MAX_SMS)

    def prepare(self, counts: list[list[int]], hidden: int, topk: int, num_sms: int) -> bool:
        """Every rank calls this with the same arguments (the notify kernel's R x R counts, x's
        hidden size, top-k, the Config's SM count) after a fresh dispatch; True when that handle's
        combine can take the copy engines (the staging buffer is grown first if needed,
        collectively; with the dispatch regions when this call dispatches by copy engines)."""
        if not self.enabled:
            return False
        need = staging_rows_needed(counts)
        # NOTES: below Tuning.ht_ce_min_mb of rows between a pair of ranks the ring kernels beat the
        # copy engines in dispatch and combine (the begin kernel, the side streams and the copies'
        # set-up are fixed costs; docs/benchmarks.md, "Copy engines or rings"); every rank has the
        # same counts, so every rank decides alike.
        if need * hidden * 2 < self.min_bytes:
            return False
        want_d = self.wants_dispatch(num_sms) or self.d_region > 0
        if (self.mem is not None and need <= self.cap and hidden == self.hidden and topk <= self.topk
                and (self.d_region > 0 or not want_d)):
            return True
        cap = max(self.cap if hidden == self.hidden else 0, -(-max(need, 1) // _CAP_STEP) * _CAP_STEP)
        topk = max(topk, self.topk if hidden == self.hidden else 0)
        c_region = region_bytes(cap, hidden, topk)
        d_region = dispatch_layout(cap, hidden * 2, -(-hidden // 128), topk)["bytes"] if want_d else 0
        total = DATA_OFF + (self.R - 1) * (c_region + d_region)
        if total > self.max_bytes:
            return False  # the same on every rank: same counts, same limit (checked at build)
        if not self._establish(cap, hidden, topk, total):
            return False
        self.c_region, self.d_region = c_region, d_region
        return True

    def _establish(self, cap: int, hidden: int, topk: int, total: int) -> bool:
        """(Re)allocate and exchange the staging buffers, collectively. If any rank cannot allocate
        (out of device memory), every rank learns it from the exchange, drops the copy-engine path
        for good and keeps the ring kernels: no rank is left waiting on a peer that took the other
        path."""
        drv = self.ec.drv
        torch.cuda.synchronize(self.dev)
        self.ec.host_barrier()  # nobody still reads or writes the old buffers
        if self.mem is not None:
            self.mem.free()
            self.mem = None
        try:
            mem = DeviceMemory(self.dev, total)
        except Exception as e:  # noqa: BLE001 -- the driver's out-of-memory error; any failure counts
            mem, why = None, f"{type(e).__name__}: {e}"
        handles = [None] * self.R
        dist.all_gather_object(handles, mem.ipc_handle() if mem is not None else why, group=self.ec.ctx.group)
        failed = [(r, h) for r, h in enumerate(handles) if isinstance(h, str)]
        if failed:
            if mem is not None:
                mem.free()
            self.enabled = self.dispatch_enabled = False
            self.cap = 0
            warnings.warn(f"uccl_ep: the copy-engine HT ops are off for this Buffer: rank {failed[0][0]} could not "
                          f"allocate {total >> 20} MiB of staging ({failed[0][1]}); the ring kernels run instead "
                          "(Tuning(ht_combine_ce=False) skips the attempt)", RuntimeWarning, stacklevel=4)
            self.ec.host_barrier()
            return False
        self.mem = mem
        self._pack_cache.clear()  # the steps encode the peers' mappings too
        drv.memset_d8(self.dev, self.mem.ptr, 0, DATA_OFF, 0)
        drv.synchronize(self.dev)
        self.peer_stage = [self.mem.ptr if r == self.rank else self.mem.open_peer(h) for r, h in enumerate(handles)]
        drv.memcpy_htod(self.dev, self.peer_table.ptr, struct.pack(f"<{self.R}Q", *self.peer_stage))
        self._warm_copy_path()
        self.cap, self.hidden, self.topk = cap, hidden, topk
        self.ec.host_barrier()
        return True

    def _warm_copy_path(self) -> None:
        """One 8-byte copy into every peer's scratch word on that peer's copy stream, waited for here.

        NOTES: a dispatch launches its SM kernel before the host issues the copy chains its peer
        waits for. The first copy to a newly mapped peer, on a new stream, may block the host until the
        device is idle (the driver setting up the peer path); the device then waits on a kernel that
        waits on this rank's copies, so both ranks' kernels time out. Done once here, while nothing
        is queued, later copies only enqueue."""
        for j in range(self.R):
            if j != self.rank:
                self._side(j, [], lambda st, j=j: self.ec.drv.memcpy_dtod_async_batch(
                    self.dev, st, struct.pack("<3Q", self.peer_stage[j] + WARM_OFF, self.mem.ptr + WARM_OFF, 8)),
                    torch.device("cuda", self.dev))
        self.ec.drv.synchronize(self.dev)

    # -- combine ------------------------------------------------------------------------------------
    def usable(self, plan, x, topk_weights) -> bool:
        K = topk_weights.shape[1] if topk_weights is not None else 0
        return (getattr(plan, "ce", False) and self.mem is not None and x.shape[1] == self.hidden
                and K <= self.topk and getattr(plan, "recv_counts", None) is not None)

    def _kernels(self):
        if self._k is None:
            from . import ht_tuning
            c_defs = ht_tuning.kernel_defines(self.R, self.engine.combine_block, self.defines)[1]
            d_defs = ht_tuning.kernel_defines(self.R, self.engine.block, self.defines)[1]
            self._k = {"ht_combine_ce": load_kernel(self.dev, "ht/nvlink/combine_ce.cu", "ht_combine_ce", c_defs)}
            self._k.update({n: load_kernel(self.dev, "ht/nvlink/dispatch_ce.cu", n, d_defs)
                            for n in ("ht_ce_begin", "ht_ce_wait", "ht_dispatch_ce")})
        return self._k

    def _begin(self, stream: int, dispatch: bool) -> None:
        """The op's epoch, and the wait until every peer freed what this rank wrote there last time."""
        fixed = ((self.mem.ptr, self.ec.error_dev_ptr, D_EPOCH_OFF, D_EPOCH_SRC_OFF, D_FREED_OFF, _PHASE_HT_DISPATCH_SEND)
                 if dispatch else
                 (self.mem.ptr, self.ec.error_dev_ptr, EPOCH_OFF, EPOCH_SRC_OFF, FREED_OFF, _PHASE_HT_COMBINE_SEND))
        self._kernels()["ht_ce_begin"].launch(1, 32, self._begin_params.pack(
            fixed + (self.R, self.rank, self.ec.timeout_ns)), stream)

    def _fork(self, cur):
        if self._fork_event is None:
            self._fork_event = torch.cuda.Event()
        self._fork_event.record(cur)
        return self._fork_event

    def _packed(self, key: tuple, build):
        """The packed copy steps of a call, cached by everything they encode (pointers included):
        back-to-back calls on the same tensors (the caching allocator hands the same blocks back)
        skip rebuilding them. NOTES: the host builds and packs ~30 steps per call at EP2, tens of
        microseconds of Python that the device would wait for, a sizeable share of an op."""
        hit = self._pack_cache.get(key)
        if hit is None:
            hit = build()
            if len(self._pack_cache) >= 16:
                self._pack_cache.pop(next(iter(self._pack_cache)))
            self._pack_cache[key] = hit
        return hit

    def _side(self, j: int, after: list, issue, device) -> "torch.cuda.Event":
        """Peer j's copy stream: wait for the events in `after`, run `issue(stream)`, return an event after it."""
        side = self._streams.get(j)
        if side is None:
            side = self._streams[j] = torch.cuda.Stream(device)
        for ev in after:
            side.wait_event(ev)
        issue(side.cuda_stream)
        done = self._done_events.get(j)
        if done is None:
            done = self._done_events[j] = torch.cuda.Event()
        done.record(side)
        return done

    # -- dispatch -----------------------------------------------------------------------------------
    def dispatch_layout_for(self, plan, hidden_bytes: int, num_scales: int, topk: int, num_sms: int) -> dict | None:
        """The dispatch region layout of this call, or None when it takes the ring dispatch (the
        same answer on every rank: same plan, same Config)."""
        if not (self.wants_dispatch(num_sms) and getattr(plan, "ce", False) and self.mem is not None and self.d_region
                and getattr(plan, "recv_counts", None) is not None):
            return None
        lay = dispatch_layout(self.cap, hidden_bytes, num_scales, topk)
        return lay if lay["bytes"] <= self.d_region else None

    def dispatch(self, lay, x, scales, topk_idx, topk_weights, in_rank, outs, handle_mats, plan, num_sms: int) -> None:
        """x -> recv_x (own rows) and the peers' staging buffers (their rows); this rank's copy
        engines move what the peers wrote here into recv_x (one chain per source)."""
        recv_x, recv_scales, recv_idx, recv_w, recv_src, send_head = outs
        rank_prefix, channel_prefix = handle_mats
        R = self.R
        hb = x.shape[1] * x.element_size()
        ns = scales.shape[1] if scales is not None else 0
        K = topk_idx.shape[1] if topk_idx is not None else 0
        chunk = chunk_rows(self.cap, 0, hb, chunk_bytes=self.chunk_bytes)
        k = self._kernels()
        cur = torch.cuda.current_stream(x.device)
        self._begin(cur.cuda_stream, dispatch=True)
        forked = self._fork(cur)
        d_base = DATA_OFF + (R - 1) * self.c_region
        ptr = tensor_ptr
        params = pack_params(
            "HTDispatchCEParams", x=x.data_ptr(), x_scales=ptr(scales), topk_idx=ptr(topk_idx),
            topk_weights=ptr(topk_weights), is_token_in_rank=in_rank.data_ptr(), channel_prefix=channel_prefix.data_ptr(),
            rank_prefix=rank_prefix.data_ptr(), recv_x=recv_x.data_ptr(), recv_scales=ptr(recv_scales),
            recv_topk_idx=ptr(recv_idx), recv_topk_weights=ptr(recv_w), recv_src_idx=ptr(recv_src),
            send_head=ptr(send_head), stage=self.mem.ptr, peer_stage=self.peer_table.ptr, error=self.ec.error_dev_ptr,
            num_tokens=x.shape[0], hidden_bytes=hb, num_scales=ns,
            scale_stride_token=scales.stride(0) if scales is not None else 0,
            scale_stride_col=scales.stride(1) if scales is not None else 0, num_topk=K,
            num_experts=plan.num_experts, num_ranks=R, rank=self.rank, num_channels=plan.num_channels,
            region_base=d_base, region_bytes=self.d_region, scales_off=lay["scales_off"], topk_off=lay["topk_off"],
            weights_off=lay["weights_off"], src_off=lay["src_off"], chunk_rows=chunk, fresh=int(send_head is not None),
            timeout_ns=self.ec.timeout_ns)
        # NOTES: the SM kernel goes first, the copy chains after it: building and issuing the chains
        # takes the host a few hundred microseconds, and with the kernel queued behind them the
        # device idled that long (tools/lab/trace_ht.py shows it). The chains
        # fork from the event after the begin kernel, not after this kernel (they overlap with it).
        k["ht_dispatch_ce"].launch(num_sms, self.engine.block, params, cur.cuda_stream)
        self.dispatches += 1
        outs_ptrs = {"recv_x": recv_x.data_ptr(), "recv_scales": ptr(recv_scales), "recv_topk_idx": ptr(recv_idx),
                     "recv_topk_weights": ptr(recv_w), "recv_src_idx": ptr(recv_src)}

        def build():
            chains = receive_chain(self.rank, list(plan.recv_counts), self.mem.ptr, self.peer_stage, d_base,
                                   self.d_region, lay, chunk, hb, ns, K, outs_ptrs, self.ec.error_dev_ptr,
                                   self.ec.timeout_ns)
            return {j: b"".join(struct.pack("<12Q", *(v & (2**64 - 1) for v in s))
                                for s in [st for c in chunks for st in c] + tail)
                    for j, (chunks, tail) in chains.items()}
        packed = self._packed(("d", tuple(plan.recv_counts), tuple(outs_ptrs.values()), hb, ns, K, chunk,
                               self.mem.ptr, d_base, self.d_region, tuple(lay.values()), self.ec.error_dev_ptr,
                               self.ec.timeout_ns), build)
        wait_fn = k["ht_ce_wait"].function
        joins = [self._side(j, [forked], lambda st, blob=blob: self.ec.drv.ce_chain(self.dev, st, wait_fn, blob),
                            x.device) for j, blob in packed.items()]
        for done in joins:
            cur.wait_event(done)

    def combine(self, x, handle, topk_weights, b0, b1, out, out_w, num_sms: int, smem: int) -> None:
        plan, R, H = handle.plan, self.R, x.shape[1]
        K = topk_weights.shape[1] if topk_weights is not None else 0
        w_ptr = tensor_ptr(topk_weights)
        chunk = chunk_rows(self.cap, self.hidden, chunk_bytes=self.chunk_bytes)
        k = self._kernels()
        cur = torch.cuda.current_stream(x.device)
        self._begin(cur.cuda_stream, dispatch=False)
        forked = self._fork(cur)
        params = self._combine_params.pack(
            (self.mem.ptr, self.peer_table.ptr, self.ec.error_dev_ptr, plan.num_tokens, H, K, R, self.rank,
             plan.num_channels, self.c_region, self.cap, chunk, self.ec.timeout_ns),
            x.data_ptr(), w_ptr, tensor_ptr(b0), tensor_ptr(b1), out.data_ptr(), tensor_ptr(out_w),
            handle[4].data_ptr(), handle[5].data_ptr(),
            handle[1].data_ptr(), handle[2].data_ptr())

        def build():
            copies = copy_list(self.rank, list(plan.recv_counts), x.data_ptr(), w_ptr, H, K, self.peer_stage,
                               self.c_region, self.cap, chunk, self.mem.ptr + EPOCH_SRC_OFF)
            return {j: b"".join(struct.pack("<3Q", *op) for op in ops) for j, ops in copies.items()}
        packed = self._packed(("c", tuple(plan.recv_counts), x.data_ptr(), w_ptr, H, K, self.mem.ptr, self.c_region,
                               self.cap, chunk), build)
        joins = [self._side(j, [forked], lambda st, blob=blob: self.ec.drv.memcpy_dtod_async_batch(self.dev, st, blob),
                            x.device) for j, blob in packed.items()]
        # NOTES: the copies first, then the sum kernel (unlike dispatch): the copies' steps are cached
        # (`_packed`), so issuing them costs the host little, and a caller that waits for each combine
        # no longer sees one chunk copy of the call stall behind the spinning sum kernel
        # (docs/benchmarks.md, "Synchronized copy-engine combine").
        k["ht_combine_ce"].launch(num_sms, self.engine.combine_block, params, cur.cuda_stream, smem=smem)
        for done in joins:
            cur.wait_event(done)

    def free(self) -> None:
        if self.mem is not None:
            self.mem.free()
            self.mem = None
        if self.peer_table is not None:
            self.peer_table.free()
