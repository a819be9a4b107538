"""Low-latency mode of the CUDA executor: NVLink-direct kernels (ll/nvlink/dispatch.cu, ll/nvlink/combine.cu).

Buffer layout (inside this rank's `num_rdma_bytes` IPC buffer), two alternating sets, each:
  send     [E_loc, R*T, H] bf16      the zero-copy combine staging area (get_next_..._buffer)
  recv     dispatch: token area [R][T] messages (payload, then FP8 scales); or combine: [E][T][H]
           bf16 rows (one op at a time uses a set); then, past both, the flags [E][T] u64
           (tag << 32 | ...): the dispatch's per slot [E_loc][R][T], the combine's per row [E][T];
           never cleared (tags tell ops apart); then the LogFMT combine's meta words [E][T][H/128]
           u32 (its rows use the BF16 rows' room; device/logfmt.cuh)
  signals  dispatch [E_loc][R] u64; (tag << 32) | count, never cleared
Device words (a small workspace): seq[2] (completed ops per set: the tag of the next op on a set
is seq + 1), done[2] (the recv kernels' last-block counters).

The layout depends on (T, H, E); when a call changes it, both sets are cleaned and the ranks
synchronize once (host barrier), so the first call of a new shape is not graph-capturable, like
DeepEP's requirement that these stay fixed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..tuning import DEFAULT as DEFAULT_TUNING, Tuning
from ..errors import InvalidArgument, LimitExceeded
from ..handles import LowLatencyHandle
from ..protocol.ll_plan import LowLatencyPlan
from . import native_ops
from .runtime import (DeviceMemory, ParamTemplate, current_stream, device_arch, load_kernel, raw_tensor, sm_number,
                      warp_size)

__all__ = ["LowLatencyEngine", "dispatch_outputs"]

# NOTES: areas are 16-byte aligned (the widest access is a 16-byte vector; signals are 8 bytes), not
# 128: with 128 the three areas' padding made tiny shapes (1-2 tokens) overrun the buffer that
# get_low_latency_rdma_size_hint sizes, which DeepEP callers pass as is.
_ALIGN = 16
# Threads per block of each kernel (one block per expert or token; see the kernels' notes).
_SEND_BLOCK, _RECV_BLOCK = 512, 256
# The -D build of the combine kernels for use_logfmt=True (ll/nvlink/combine.cu, ll/proxy/combine.cu).
_LOGFMT = ("UCCL_EP_LL_LOGFMT=1",)


def _received(follows_send: bool = False) -> None:
    """The receive phase of an op whose torch op already issued it (`LowLatencyEngine._torch_ops`)."""


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _combine_recv_threads(tuning: Tuning = DEFAULT_TUNING) -> int:
    n = tuning.ll_combine_recv_threads
    lanes = warp_size()  # whole warps: 64-lane wavefronts on AMD
    if n % lanes:
        raise InvalidArgument("tuning.ll_combine_recv_threads", f"a multiple of {lanes} in [{lanes}, 512]", n)
    return n


@dataclass(frozen=True)
class _Layout:
    num_max: int
    hidden: int
    num_experts: int
    num_ranks: int
    msg_bytes: int
    send_off: int
    recv_off: int
    flag_off: int  # of the dispatch's slot flags and the combine's row flags, from recv_off
    sig_off: int
    set_bytes: int
    meta_off: int  # of the LogFMT combine's meta words, from recv_off

    @staticmethod
    def make(num_max: int, hidden: int, num_experts: int, num_ranks: int) -> "_Layout":
        msg = 2 * hidden  # BF16 row, or FP8 row (hidden) + its scales (hidden / 32)
        send = _align(num_experts * num_max * hidden * 2)
        # dispatch (ll/nvlink/dispatch.cu): token area [R][num_max] messages; combine (ll/nvlink/combine.cu):
        # [E][num_max] BF16 rows; then, past both, the u64 flags [E][num_max] both kernels use (a
        # flag is read before its writer is known to be done, so no other op's bytes may land there)
        token_area = _align(num_ranks * num_max * msg)
        flags = _align(max(num_experts * num_max * 2 * hidden, token_area))
        meta = flags + _align(num_experts * num_max * 8)
        recv = meta + _align(num_experts * num_max * hidden // 32)
        sig = _align(num_experts * 8)
        return _Layout(num_max, hidden, num_experts, num_ranks, msg, 0, send, flags, send + recv,
                       send + recv + sig, meta)

    def dispatch_signal_off(self, s: int) -> int:
        return s * self.set_bytes + self.sig_off


@lru_cache(maxsize=64)
def _output_specs(E_loc: int, R: int, num_max: int, H: int, use_fp8: bool, use_ue8m0: bool):
    """The allocations of `dispatch_outputs` for one shape, worked out once."""
    rows = R * num_max
    if use_fp8:
        cols = H // 512 if use_ue8m0 else H // 128
        scales = ((E_loc, rows, cols), (cols * rows, 1, rows),  # column-major, as DeepEP's
                  torch.int32 if use_ue8m0 else torch.float32)
    else:
        scales = None
    pad = (E_loc + 63) // 64 * 64
    return ((E_loc, rows, H), torch.float8_e4m3fn if use_fp8 else torch.bfloat16, scales, pad, pad + E_loc * rows,
            (E_loc, rows), (E_loc, R))


def dispatch_outputs(dev, E_loc: int, R: int, num_max: int, H: int, use_fp8: bool, use_ue8m0: bool):
    """(recv_x, scales or None, recv_count, src_info, layout_range) of a low-latency dispatch."""
    # NOTES: every torch call costs a microsecond or more of host time, most of a small eager LL
    # call: one allocation per dtype (views of one byte buffer cost a slice and two views per
    # output), recv_count and src_info sharing one, src_info 256-byte aligned as before.
    x_shape, x_dtype, scales, pad, num_ints, src_shape, range_shape = _output_specs(E_loc, R, num_max, H, use_fp8,
                                                                                   use_ue8m0)
    recv_x = torch.empty(x_shape, dtype=x_dtype, device=dev)
    if scales is not None:
        scales = torch.empty_strided(scales[0], scales[1], dtype=scales[2], device=dev)
    ints = torch.empty(num_ints, dtype=torch.int32, device=dev)
    layout_range = torch.empty(range_shape, dtype=torch.int64, device=dev)
    return recv_x, scales, ints[:E_loc], ints[pad:].view(src_shape), layout_range


# The receive kernels' per-call output fields, in `dispatch_output_pointers`' order.
_DISPATCH_RECV_OUTPUTS = ("recv_x", "recv_scales", "recv_count", "src_info", "layout_range", "cumulative_stats",
                          "wait_stats")


def dispatch_output_pointers(outs, cumulative_stats, wait_stats) -> tuple[int, ...]:
    """The device addresses of a dispatch's outputs (`dispatch_outputs`) and optional stats tensors,
    in `_DISPATCH_RECV_OUTPUTS` order (0 for an absent one)."""
    recv_x, scales, recv_count, src_info, layout_range = outs
    return (recv_x.data_ptr(), scales.data_ptr() if scales is not None else 0, recv_count.data_ptr(),
            src_info.data_ptr(), layout_range.data_ptr(),
            cumulative_stats.data_ptr() if cumulative_stats is not None else 0,
            wait_stats.data_ptr() if wait_stats is not None else 0)


class LowLatencyEngine:
    def __init__(self, ec) -> None:
        self.ec = ec
        self.dev = ec.device
        self.R, self.rank = ec.ctx.num_ranks, ec.ctx.rank
        self.mem: DeviceMemory = ec.ll_mem
        self.peer_base: list[int] = ec.ll_peer_base
        self.idx = 0
        self.layout: _Layout | None = None
        # seq[2] | done[2] as u32 words, then the peer pointer tables (4 x R u64: per set the recv
        # areas and the dispatch signal areas); made by ensure_layout.
        self.work: DeviceMemory | None = None
        drv = ec.drv
        self.num_sms = drv.device_attribute(self.dev, drv.ATTR_SM_COUNT)
        self.combine_recv_threads = _combine_recv_threads(ec.ctx.tuning)  # read once: off the per-call host path
        # Receive kernels launched right after their send kernel may overlap its tail (programmatic
        # dependent launch, sm_90+; the send kernels allow it once every block has read the op counter).
        self.recv_pdl = ec.ctx.tuning.ll_pdl and sm_number(device_arch(self.dev)) >= 90
        self._k = {n: load_kernel(self.dev, src, n) for src, n in (
            ("ll/nvlink/dispatch.cu", "ll_dispatch_send"), ("ll/nvlink/dispatch.cu", "ll_dispatch_recv"),
            ("ll/nvlink/combine.cu", "ll_combine_send"), ("ll/nvlink/combine.cu", "ll_combine_recv"))}
        # LogFMT combine: the -D build of ll/nvlink/combine.cu (loaded now, see its NOTES)
        self._k_logfmt = {n: load_kernel(self.dev, "ll/nvlink/combine.cu", n, _LOGFMT) for n in
                          ("ll_combine_send", "ll_combine_recv")}
        self._template_cache: dict = {}
        # uccl_ep's torch ops (native_ops.py): an eager op's allocation and launches in one native call,
        # issued through the bindings' runtime (a driver that makes op plans)
        self._torch_ops = native_ops.ops() if (self._TORCH_OPS and ec.ctx.tuning.ll_torch_ops
                                               and hasattr(drv, "OpPlan")) else None

    def _templates(self, lay, key: tuple, build):
        """The parameter templates (`runtime.ParamTemplate`) of one (op, buffer set, flags) under
        layout `lay`: `build()` once, then from the cache while the layout stays.

        NOTES: what differs per call (tensor pointers, the token count) is packed per call; the rest
        (buffer offsets, peer tables, sizes, flags) is resolved here once: an eager op's host path."""
        hit = self._template_cache.get(key)
        if hit is not None and hit[0] is lay:
            return hit[1]
        if len(self._template_cache) >= 256:
            self._template_cache.clear()
        built = build()
        self._template_cache[key] = (lay, built)
        return built

    # -- layout ------------------------------------------------------------------------------
    def _table(self, i: int) -> int:
        return self.work.ptr + 64 + i * 8 * self.R

    def _seq(self, s: int) -> int:
        return self.work.ptr + 4 * s

    def _done(self, s: int) -> int:
        return self.work.ptr + 8 + 4 * s

    def ensure_layout(self, num_max: int, hidden: int, num_experts: int) -> _Layout:
        lay = self.layout
        if lay is not None and (lay.num_max, lay.hidden, lay.num_experts) == (num_max, hidden, num_experts):
            return lay
        lay = _Layout.make(num_max, hidden, num_experts, self.R)
        if 2 * lay.set_bytes > self.mem.nbytes:
            raise LimitExceeded("num_rdma_bytes", f"bytes of the low-latency buffer ({num_max} tokens, hidden {hidden}, "
                                f"{num_experts} experts)", 2 * lay.set_bytes, self.mem.nbytes)
        drv = self.ec.drv
        tables = []
        for s in (0, 1):
            tables.append([b + s * lay.set_bytes + lay.recv_off for b in self.peer_base])
            tables.append([b + lay.dispatch_signal_off(s) for b in self.peer_base])
        blob = b"".join(struct.pack(f"<{self.R}Q", *t) for t in tables)
        torch.cuda.synchronize(self.dev)
        if self.work is not None:
            self.work.free()
        self.work = DeviceMemory(self.dev, 64 + 4 * 8 * self.R)
        drv.memcpy_htod(self.dev, self.work.ptr + 64, blob)
        self.layout = lay
        self.clean()
        return lay

    def clean(self) -> None:
        """Zero both sets (signals, flags) and the device words on every rank (host-synchronizing;
        in shrink mode masked ranks are left out, and a rank that does not come is masked)."""
        drv = self.ec.drv
        torch.cuda.synchronize(self.dev)
        self.ec.host_barrier("low_latency buffer clean (before)", masks=True)
        drv.memset_d8(self.dev, self.mem.ptr, 0, self.mem.nbytes, 0)
        drv.memset_d8(self.dev, self.work.ptr, 0, 64, 0)
        drv.synchronize(self.dev)
        self.idx = 0
        self.ec.host_barrier("low_latency buffer clean (after)", masks=True)

    def _flip(self) -> int:
        s = self.idx
        self.idx ^= 1
        return s

    def _signal_area(self, s: int) -> int:
        return self.mem.ptr + self.layout.dispatch_signal_off(s)

    # -- dispatch ------------------------------------------------------------------------------
    def _dispatch_end(self, owner, finish, outs, T: int, num_max: int, H: int, num_experts: int, masked,
                      use_fp8: bool):
        """What every dispatch path returns: ((recv_x, scales) or recv_x, recv_count, handle, finish)."""
        recv_x, scales, recv_count, src_info, layout_range = outs
        plan = LowLatencyPlan(num_tokens=T, num_max=num_max, hidden=H, num_experts=num_experts,
                              recv_count=recv_count, masked_at_dispatch=tuple(sorted(masked)) if masked else ())
        handle = LowLatencyHandle((src_info, layout_range, num_max, H, num_experts), owner, plan)
        return ((recv_x, scales) if use_fp8 else recv_x), recv_count, handle, finish

    def _receive_phase(self, kernel, grid: int, block: int, params: bytes, keep, pdl: bool):
        """An op's receive phase, run later (now, in the recv hook or after the event): check the error
        word, launch `kernel` (by programmatic dependent launch right after the send kernel where
        `pdl`), keeping the op's tensors (`keep`) alive until then."""
        def finish(follows_send: bool = False) -> None:
            self.ec.check_error()
            _ = keep
            kernel.launch(grid, block, params, current_stream(self.dev), programmatic=follows_send and pdl)
        return finish

    def _shrink_fields(self) -> dict:
        """The mask words every LL kernel reads (0 outside shrink mode, where no rank is ever masked:
        the kernels then read none), and whether an expired wait on a peer masks it."""
        shrink = bool(self.ec.ctx.enable_shrink)
        return dict(mask=self.ec.mask_ptr if shrink else 0, shrink=int(shrink))

    def _dispatch_templates(self, lay, s, K, num_experts, use_fp8, round_scale, use_ue8m0):
        shrink = self._shrink_fields()
        send = ParamTemplate("LLDispatchParams", ("x", "topk_idx", "num_tokens"), peer_recv=self._table(2 * s),
                             peer_signal=self._table(2 * s + 1), seq=self._seq(s), flag_off=lay.flag_off,
                             num_max=lay.num_max, hidden=lay.hidden, num_topk=K, num_experts=num_experts,
                             num_ranks=self.R, rank=self.rank, use_fp8=use_fp8, round_scale=round_scale,
                             msg_bytes=lay.msg_bytes, mask=shrink["mask"], error=self.ec.error_dev_ptr)
        recv = ParamTemplate(
            "LLDispatchRecvParams", _DISPATCH_RECV_OUTPUTS,
            recv_area=self.mem.ptr + s * lay.set_bytes + lay.recv_off, signal=self._signal_area(s), seq=self._seq(s),
            done=self._done(s), flag_off=lay.flag_off, error=self.ec.error_dev_ptr, num_max=lay.num_max,
            hidden=lay.hidden, num_local_experts=num_experts // self.R, num_ranks=self.R, rank=self.rank,
            use_fp8=use_fp8, use_ue8m0=use_ue8m0, msg_bytes=lay.msg_bytes, timeout_ns=self.ec.timeout_ns, **shrink)
        return send, recv

    # What differs between this engine's dispatch and the proxy path's (ll_proxy.py): the kernels,
    # the send kernel's shared memory per expert, the parameter templates and what runs around the
    # send kernel (the proxy path's copy-ring hand-over and copy kernel).
    _DISPATCH_KERNELS = ("ll_dispatch_send", "ll_dispatch_recv")
    _DISPATCH_SMEM_PER_EXPERT = 8
    # NOTES: the proxy path's send runs between copy-ring hand-overs (_before_send / _after_send),
    # which the torch op does not know of: it keeps the Python path.
    _TORCH_OPS = True
    _torch_ops = None  # (ll_dispatch, ll_combine) where this engine uses them (__init__)

    def _before_send(self) -> None:
        pass

    def _after_send(self) -> None:
        pass

    def dispatch(self, owner, x, topk_idx, num_max, num_experts, use_fp8, round_scale, use_ue8m0, masked,
                 cumulative_stats, wait_stats, recv_follows=False):
        # NOTES: the steps every call takes are written out here, not in helpers: an eager op's host
        # path pays each Python frame (docs/benchmarks.md, "Eager calls"). The Buffer's host-side
        # masked set is not passed to the kernels: they read the executor's device mask (shrink.py)
        # when they run, which also holds the ranks they mask; it only goes into the handle's plan.
        lay = self.layout
        if lay is None or lay.num_max != num_max or lay.hidden != x.shape[1] or lay.num_experts != num_experts:
            lay = self.ensure_layout(num_max, x.shape[1], num_experts)
        s = self.idx
        self.idx ^= 1
        x, topk_idx = x.contiguous(), topk_idx.contiguous()
        (T, H), K = x.shape, topk_idx.shape[1]
        # the last item: whether the entry holds the op plan too (the torch op path)
        key = ("dispatch", s, K, num_experts, use_fp8, round_scale, use_ue8m0, self._torch_ops is not None)
        send_kernel, recv_kernel = self._DISPATCH_KERNELS
        E_loc = num_experts // self.R
        if self._torch_ops is not None:
            hit = self._template_cache.get(key)
            if hit is not None and hit[0] is lay:
                send, recv, plan = hit[1]
            else:
                send, recv, plan = self._templates(lay, key, lambda: self._dispatch_plan(
                    lay, s, K, num_experts, use_fp8, round_scale, use_ue8m0))
            *outs, status = self._torch_ops[0](x, topk_idx, cumulative_stats, wait_stats, plan.address,
                                               current_stream(self.dev), recv_follows, self.recv_pdl)
            if status == native_ops.RECEIVE_LAUNCHED:
                return self._dispatch_end(owner, _received, outs, T, num_max, H, num_experts, masked, use_fp8)
        else:
            send, recv = self._templates(lay, key, lambda: self._dispatch_templates(lay, s, K, num_experts, use_fp8,
                                                                                    round_scale, use_ue8m0))
            outs = dispatch_outputs(x.device, E_loc, self.R, num_max, H, use_fp8, use_ue8m0)
            self._before_send()
            self._k[send_kernel].launch(max(T, 1), _SEND_BLOCK, send.pack(x.data_ptr(), topk_idx.data_ptr(), T),
                                        current_stream(self.dev), smem=self._DISPATCH_SMEM_PER_EXPERT * num_experts)
            self._after_send()
        recv_params = recv.pack(*dispatch_output_pointers(outs, cumulative_stats, wait_stats))
        keep = (x, topk_idx, *outs, cumulative_stats, wait_stats)
        finish = self._receive_phase(self._k[recv_kernel], E_loc, _RECV_BLOCK, recv_params, keep, self.recv_pdl)
        return self._dispatch_end(owner, finish, outs, T, num_max, H, num_experts, masked, use_fp8)

    def _dispatch_plan(self, lay, s, K, num_experts, use_fp8, round_scale, use_ue8m0):
        """The dispatch templates and their `_C.cuda.OpPlan` for the torch op (shape words: ll_ops.cc)."""
        send, recv = self._dispatch_templates(lay, s, K, num_experts, use_fp8, round_scale, use_ue8m0)
        send_kernel, recv_kernel = self._DISPATCH_KERNELS
        E_loc, rows, H = num_experts // self.R, self.R * lay.num_max, lay.hidden
        cols = (H // 512 if use_ue8m0 else H // 128) if use_fp8 else 0
        plan = self.ec.drv.OpPlan(
            send.launch_spec(self._k[send_kernel], _SEND_BLOCK, self._DISPATCH_SMEM_PER_EXPERT * num_experts),
            recv.launch_spec(self._k[recv_kernel], _RECV_BLOCK),
            [E_loc, rows, H, int(use_fp8), int(use_ue8m0), cols, self.R], self.ec.errors.host_ptr)
        return send, recv, plan

    # -- combine -------------------------------------------------------------------------------
    def next_combine_buffer(self, handle) -> torch.Tensor:
        _, _, num_max, hidden, num_experts = handle
        lay = self.ensure_layout(num_max, hidden, num_experts)
        E_loc = num_experts // self.R
        off = self.idx * lay.set_bytes + lay.send_off
        nbytes = E_loc * self.R * num_max * hidden * 2
        t = raw_tensor(self.mem.ptr + off, nbytes, self.dev, self.mem)
        return t.view(torch.bfloat16).view(E_loc, self.R * num_max, hidden)

    def _combine_templates(self, lay, s, num_experts):
        shrink = self._shrink_fields()
        E_loc = num_experts // self.R
        send = ParamTemplate("LLCombineParams", ("y", "src_info", "layout_range"), peer_recv=self._table(2 * s),
                             seq=self._seq(s), flag_off=lay.flag_off, num_max=lay.num_max, hidden=lay.hidden,
                             num_local_experts=E_loc, num_ranks=self.R, rank=self.rank, mask=shrink["mask"],
                             meta_off=lay.meta_off)
        recv = ParamTemplate(
            "LLCombineRecvParams", ("topk_idx", "topk_weights", "out", "wait_stats", "num_tokens", "num_topk"),
            recv_area=self.mem.ptr + s * lay.set_bytes + lay.recv_off, seq=self._seq(s), flag_off=lay.flag_off,
            done=self._done(s), error=self.ec.error_dev_ptr, num_max=lay.num_max, hidden=lay.hidden,
            num_local_experts=E_loc, rank=self.rank, timeout_ns=self.ec.timeout_ns, meta_off=lay.meta_off, **shrink)
        return send, recv

    def combine(self, y, topk_idx, topk_weights, handle, masked, out, wait_stats, zero_copy, recv_follows=False,
                use_logfmt=False):
        src_info, layout_range, num_max, H, num_experts = handle
        lay = self.layout
        if lay is None or lay.num_max != num_max or lay.hidden != H or lay.num_experts != num_experts:
            lay = self.ensure_layout(num_max, H, num_experts)
        kernels = self._k_logfmt if use_logfmt else self._k
        s = self.idx
        self.idx ^= 1
        T, K = topk_idx.shape
        if zero_copy:
            y_ptr = self.mem.ptr + s * lay.set_bytes + lay.send_off
        else:
            y = y.contiguous()
            y_ptr = y.data_ptr()
        topk_idx = topk_idx.contiguous()
        topk_weights = topk_weights.contiguous()
        send_smem = 4 * (2 * num_experts + 1 + 2 * _RECV_BLOCK)
        if self._torch_ops is not None:
            key = ("combine", s, num_experts, use_logfmt, "op")
            hit = self._template_cache.get(key)
            if hit is not None and hit[0] is lay:
                send, recv, plan = hit[1]
            else:
                send, recv, plan = self._templates(lay, key, lambda: self._combine_plan(lay, s, num_experts, kernels,
                                                                                        send_smem))
            result, status = self._torch_ops[1](y_ptr, src_info, layout_range, topk_idx, topk_weights, out, wait_stats,
                                                plan.address, current_stream(self.dev), bool(recv_follows),
                                                self.recv_pdl)
            if status == native_ops.RECEIVE_LAUNCHED:
                return result, _received
        else:
            result = out if out is not None else torch.empty(T, H, dtype=torch.bfloat16, device=topk_idx.device)
            send, recv = self._templates(lay, ("combine", s, num_experts),
                                         lambda: self._combine_templates(lay, s, num_experts))
            kernels["ll_combine_send"].launch(2 * self.num_sms, _RECV_BLOCK,
                                              send.pack(y_ptr, src_info.data_ptr(), layout_range.data_ptr()),
                                              current_stream(self.dev), smem=send_smem)
        recv_params = recv.pack(topk_idx.data_ptr(), topk_weights.data_ptr(), result.data_ptr(),
                                wait_stats.data_ptr() if wait_stats is not None else 0, T, K)
        keep = (y, topk_idx, topk_weights, result, wait_stats, handle)
        return result, self._receive_phase(kernels["ll_combine_recv"], max(T, 1), self.combine_recv_threads,
                                           recv_params, keep, self.recv_pdl)

    def _combine_plan(self, lay, s, num_experts, kernels, send_smem):
        """The combine templates and their `_C.cuda.OpPlan` for the torch op (shape words: ll_ops.cc)."""
        send, recv = self._combine_templates(lay, s, num_experts)
        plan = self.ec.drv.OpPlan(send.launch_spec(kernels["ll_combine_send"], _RECV_BLOCK, send_smem),
                                  recv.launch_spec(kernels["ll_combine_recv"], self.combine_recv_threads),
                                  [lay.hidden, 2 * self.num_sms], self.ec.errors.host_ptr)
        return send, recv, plan
