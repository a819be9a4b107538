"""Normal (high-throughput) intranode mode of the CUDA executor (layout.cu, ht/nvlink/*.cu).

NVL buffer of each rank: [0, 512 KiB) control (notify area, ring progress counters, written by
peers), then the rings: one per (channel, source rank), `ring_slots` slots of `slot_bytes` each.
Device workspace (local): cumulative ring positions written per (channel, destination) and
consumed per (channel, source), and the fresh-dispatch sequence number.

The ring geometry (channels = config.num_sms / 2, slots = num_max_nvl_chunked_recv_tokens) is
fixed on first use; a call with another geometry resets every rank's counters once (a host
barrier), so keep the Config constant across calls (as frameworks do) and warm up before graph
capture.
"""

from __future__ import annotations

import struct
import time

import torch

from ..errors import InvalidArgument, LimitExceeded, Timeout
from ..handles import NormalHandle
from ..validate import check_combine_rows
from . import ht_tuning
from .ht_ce import CopyEngineOps
from .runtime import (DeviceMemory, ParamCache, contiguous, current_stream, device_arch, dispatch_outputs, load_kernel,
                      pack_params, sm_number, tensor_ptr, warp_size)

__all__ = ["NormalEngine", "CudaNormalPlan", "launch_layout"]

_RING_OFF = 512 * 1024
_MAX_CHANNELS = 64
_HOST_OFF_INTS = 1024      # the HT host area starts 4 KiB into the mapped page (error word at 0)
_MAX_LOCAL_EXPERTS = 1024


def _align16(n: int) -> int:
    return (n + 15) // 16 * 16


def dispatch_slot_bytes(hidden_bytes: int, num_scales: int, num_topk: int) -> int:
    """Bytes of one dispatch ring slot (mirrors dispatch_slot() in ht/nvlink/dispatch.cu)."""
    topk = _align16(hidden_bytes + num_scales * 4)
    return _align16(topk + num_topk * 12 + 4)


def combine_slot_bytes(hidden: int, num_topk: int) -> int:
    return _align16(_align16(hidden * 2) + num_topk * 4)


# The ring kernels' parameters: the per-call tensor pointers, then every other field (ParamCache)
DISPATCH_POINTERS = ("x", "x_scales", "topk_idx", "topk_weights", "is_token_in_rank", "recv_x", "recv_scales",
                     "recv_topk_idx", "recv_topk_weights", "recv_src_idx", "send_head", "rank_prefix",
                     "recv_channel_prefix")
DISPATCH_FIXED = ("peer_buf", "sent", "consumed", "error", "num_tokens", "hidden_bytes", "num_scales",
                  "scale_stride_token", "scale_stride_col", "num_topk", "num_experts", "num_ranks", "rank",
                  "num_channels", "ring_slots", "slot_bytes", "warps_per_peer", "num_rows", "timeout_ns")
NOTIFY_POINTERS = ("is_token_in_rank", "num_tokens_per_expert", "rank_prefix", "channel_prefix", "recv_channel_prefix",
                   "host_tag")  # the tag changes every call too
NOTIFY_FIXED = ("peer_buf", "seq", "host", "error", "num_tokens", "num_ranks", "rank", "num_channels", "num_experts",
                "expert_alignment", "num_worst_tokens", "timeout_ns")
COMBINE_POINTERS = ("x", "topk_weights", "bias0", "bias1", "out", "out_weights", "is_token_in_rank", "send_head",
                    "rank_prefix", "recv_channel_prefix")
COMBINE_FIXED = ("peer_buf", "sent", "consumed", "error", "num_tokens", "hidden", "num_topk", "num_ranks", "rank",
                 "num_channels", "ring_slots", "slot_bytes", "warps_per_peer", "timeout_ns")


def launch_layout(kernel, num_ranks: int, topk_idx, num_experts: int):
    """get_dispatch_layout by layout.cu (``kernel``: its ht_layout), for the intranode engine and the
    engine through the proxy alike: (tokens per rank, None, tokens per expert, is_token_in_rank)."""
    T, K = topk_idx.shape
    R = num_ranks
    counts = torch.zeros(R + num_experts, dtype=torch.int32, device=topk_idx.device)
    in_rank = torch.empty(T, R, dtype=torch.bool, device=topk_idx.device)
    if T > 0:
        topk_idx = topk_idx.contiguous()
        params = pack_params("HTLayoutParams", topk_idx=topk_idx.data_ptr(), num_tokens_per_rank=counts.data_ptr(),
                             num_tokens_per_expert=counts.data_ptr() + 4 * R, is_token_in_rank=in_rank.data_ptr(),
                             num_tokens=T, num_topk=K, num_experts=num_experts, num_ranks=R)
        kernel.launch((T + 255) // 256, 256, params, current_stream(), smem=4 * (R + num_experts))
    return counts[:R], None, counts[R:], in_rank


class CudaNormalPlan:
    """What a dispatch fixed, for cached dispatch and combine (``recv_counts`` only when known)."""

    def __init__(self, num_tokens: int, num_rows: int, num_channels: int, num_recv=None, recv_counts=None):
        self.num_tokens, self.num_rows, self.num_channels = num_tokens, num_rows, num_channels
        self.num_recv = num_recv
        if recv_counts is not None:
            self.recv_counts = recv_counts


class NormalEngine:
    def __init__(self, ec) -> None:
        self.ec = ec
        self.dev = ec.device
        self.R, self.rank = ec.ctx.num_ranks, ec.ctx.rank
        if ec.nvl_mem is None:
            raise LimitExceeded("num_nvl_bytes", "bytes of the NVL buffer for normal mode", 1, 0,
                                hint="build the Buffer with num_nvl_bytes from Config.get_nvl_buffer_size_hint")
        # warps per peer (dispatch, combine); a combine receiver block runs R * Gc of them
        self.G, self.Gc = ht_tuning.warps_per_peer(self.R, ec.ctx.tuning)
        lanes = warp_size()  # the kernels give each peer G warps (64-lane wavefronts on AMD)
        self.block, self.combine_block = self.R * self.G * lanes, self.R * self.Gc * lanes
        if max(self.block, self.combine_block) > 1024:
            raise InvalidArgument("tuning.ht_warps / tuning.ht_combine_warps", f"at most {1024 // lanes} warps of "
                                  f"{lanes} threads per block", max(self.G, self.Gc) * self.R)
        self.work = DeviceMemory(self.dev, 2 * _MAX_CHANNELS * 8 * 8 + 64)
        self.peers = DeviceMemory(self.dev, 8 * self.R)
        ec.drv.memcpy_htod(self.dev, self.peers.ptr, struct.pack(f"<{self.R}Q", *ec.nvl_peer_base))
        self.geometry = None
        self.slot_bytes = 0
        self.host_tag = 0
        self._k = {n: load_kernel(self.dev, src, n) for src, n in (("layout.cu", "ht_layout"),
                                                                    ("ht/nvlink/notify.cu", "ht_notify"))}
        # ht_dispatch, ht_combine (launch bounds: the block size)
        self._k.update(ht_tuning.load_kernels(self.dev, self.R, block_threads=self.block,
                                              combine_threads=self.combine_block, defines=ec.ctx.tuning.ht_defines))
        self.combine_smem = ht_tuning.combine_smem_bytes(self.combine_block, ec.ctx.tuning.ht_defines,
                                                         sm=sm_number(device_arch(self.dev)))
        # Tuning.ht_combine_ce: combine's rows moved by copy engines (ht_ce.py)
        self.ce = CopyEngineOps(self)
        self._notify_params = ParamCache("HTNotifyParams", NOTIFY_POINTERS, NOTIFY_FIXED)
        self._dispatch_params = ParamCache("HTDispatchParams", DISPATCH_POINTERS, DISPATCH_FIXED)
        self._combine_params = ParamCache("HTCombineParams", COMBINE_POINTERS, COMBINE_FIXED)

    @property
    def _sent(self) -> int:
        return self.work.ptr

    @property
    def _consumed(self) -> int:
        return self.work.ptr + _MAX_CHANNELS * 8 * 8

    @property
    def _seq(self) -> int:
        return self.work.ptr + 2 * _MAX_CHANNELS * 8 * 8

    def _ensure_geometry(self, channels: int, slots: int) -> int:
        if self.geometry == (channels, slots):
            return self.slot_bytes
        if channels > _MAX_CHANNELS:
            raise LimitExceeded("config.num_sms", "SMs (2 per channel) of the CUDA normal kernels", 2 * channels,
                                2 * _MAX_CHANNELS)
        # NOTES: a ring must hold one position per consumer warp of a block (R * G): consumers
        # publish before they block, and the waiting one's position is at most that far past the
        # slowest head, so the producer can always write it.
        need = self.R * max(self.G, self.Gc)
        if slots < need:
            raise InvalidArgument("config.num_max_nvl_chunked_recv_tokens", f">= {need} for the CUDA kernels "
                                  "(the consumer warps of a block: tuning.ht_warps / tuning.ht_combine_warps)",
                                  slots)
        slot_bytes = (self.ec.nvl_mem.nbytes - _RING_OFF) // (channels * self.R * slots) // 16 * 16
        if slot_bytes <= 0:
            raise LimitExceeded("num_nvl_bytes", "bytes of the NVL buffer", _RING_OFF + channels * self.R * slots * 16,
                                self.ec.nvl_mem.nbytes)
        drv = self.ec.drv
        torch.cuda.synchronize(self.dev)
        self.ec.host_barrier()
        drv.memset_d8(self.dev, self.ec.nvl_mem.ptr, 0, _RING_OFF, 0)
        drv.memset_d8(self.dev, self.work.ptr, 0, self.work.nbytes, 0)
        drv.synchronize(self.dev)
        self.ec.host_barrier()
        self.geometry, self.slot_bytes = (channels, slots), slot_bytes
        return slot_bytes

    def _check_slot(self, need: int, what: str) -> None:
        if need > self.slot_bytes:
            ch, slots = self.geometry
            raise LimitExceeded("num_nvl_bytes", f"bytes per ring slot for {what} ({ch} channels x {self.R} ranks x "
                                f"{slots} slots)", need, self.slot_bytes,
                                hint="use Config.get_nvl_buffer_size_hint for num_nvl_bytes")

    # -- layout ------------------------------------------------------------------------------------
    def layout(self, topk_idx, num_experts):
        return launch_layout(self._k["ht_layout"], self.R, topk_idx, num_experts)

    # -- dispatch ----------------------------------------------------------------------------------
    def _wait_host(self, tag: int) -> None:
        errors = self.ec.errors
        deadline = time.monotonic() + self.ec.ctx.timeout_s
        spins = 0
        while errors.int32(_HOST_OFF_INTS) != tag:
            spins += 1
            if spins % 1024 == 0:
                self.ec.check_error()
                if time.monotonic() > deadline:
                    raise Timeout(self.rank, None, "ht_dispatch_notify (CPU wait for receive counts)",
                                  self.ec.ctx.timeout_s, hint="a peer did not join this dispatch")
                if spins > 100_000:
                    time.sleep(0)
        self.ec.check_error()

    def _launch_dispatch(self, x, scales, topk_idx, topk_weights, in_rank, outs, handle_mats, channels, rows):
        recv_x, recv_scales, recv_idx, recv_w, recv_src, send_head = outs
        rank_prefix, recv_channel_prefix = handle_mats
        T = x.shape[0]
        ns, sst, ssc = (scales.shape[1], *scales.stride()) if scales is not None else (0, 0, 0)
        fixed = (self.peers.ptr, self._sent, self._consumed, self.ec.error_dev_ptr, T, x.shape[1] * x.element_size(),
                 ns, sst, ssc, topk_idx.shape[1] if topk_idx is not None else 0, self._num_experts, self.R, self.rank,
                 channels, self.geometry[1], self.slot_bytes, self.G, rows, self.ec.timeout_ns)
        params = self._dispatch_params.pack(
            fixed, x.data_ptr(), tensor_ptr(scales), tensor_ptr(topk_idx), tensor_ptr(topk_weights), in_rank.data_ptr(),
            recv_x.data_ptr(), tensor_ptr(recv_scales), tensor_ptr(recv_idx), tensor_ptr(recv_w), tensor_ptr(recv_src), tensor_ptr(send_head),
            rank_prefix.data_ptr(), recv_channel_prefix.data_ptr())
        self._k["ht_dispatch"].launch(2 * channels, self.block, params, current_stream())

    def _check_x(self, x, scales) -> None:
        if scales is not None and scales.element_size() != 4:
            raise InvalidArgument("x[1]", "4-byte scales (float32 or packed int32)", str(scales.dtype))

    def dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank,
                 num_tokens_per_expert, expert_alignment, num_worst_tokens, config):
        self._check_x(x, x_scales)
        R, dev = self.R, x.device
        T = x.shape[0]
        E = num_tokens_per_expert.numel()
        E_loc = E // R
        if E_loc > _MAX_LOCAL_EXPERTS:
            raise LimitExceeded("num_tokens_per_expert", "local experts of the CUDA normal kernels", E_loc,
                                _MAX_LOCAL_EXPERTS)
        C, S = config.num_channels, config.num_max_nvl_chunked_recv_tokens
        self._ensure_geometry(C, S)
        K = topk_idx.shape[1] if topk_idx is not None else 0
        hidden_bytes = x.shape[1] * x.element_size()
        ns = x_scales.shape[1] if x_scales is not None else 0
        self._check_slot(dispatch_slot_bytes(hidden_bytes, ns, K), "dispatch")
        self._num_experts = E
        mats = torch.empty(R * R + 2 * R * C, dtype=torch.int32, device=dev)
        rank_prefix = mats[:R * R].view(R, R)
        channel_prefix = mats[R * R:R * R + R * C].view(R, C)
        recv_channel_prefix = mats[R * R + R * C:].view(R, C)
        self.host_tag = (self.host_tag + 1) & 0x3FFFFFFF
        host = self.ec.errors.dev_ptr + 4 * _HOST_OFF_INTS
        in_rank = is_token_in_rank.contiguous()
        ntpe = num_tokens_per_expert.contiguous()
        params = self._notify_params.pack(
            (self.peers.ptr, self._seq, host, self.ec.error_dev_ptr, T, R, self.rank, C, E, expert_alignment,
             num_worst_tokens, self.ec.timeout_ns),
            in_rank.data_ptr(), ntpe.data_ptr(), rank_prefix.data_ptr(), channel_prefix.data_ptr(),
            recv_channel_prefix.data_ptr(), self.host_tag)
        self._k["ht_notify"].launch(1, 512, params, current_stream())
        # NOTES: what does not depend on the receive counts is allocated while the notify kernel runs
        send_head = torch.empty(T, R, dtype=torch.int32, device=dev)
        pair_counts = None
        if num_worst_tokens > 0:
            rows, num_recv, per_src, per_expert = num_worst_tokens, None, None, []
        else:
            self._wait_host(self.host_tag)
            vals = self.ec.errors.int32_array(_HOST_OFF_INTS + 1, 1 + R + E_loc)
            num_recv, per_src, per_expert = vals[0], vals[1:1 + R], vals[1 + R:]
            rows = num_recv
            if self.ce.enabled:  # every rank's tokens per destination: the same on every rank
                flat = self.ec.errors.int32_array(_HOST_OFF_INTS + 2 + R + E_loc, R * R)
                pair_counts = [flat[i * R:(i + 1) * R] for i in range(R)]
        # the copy-engine combine for this handle: decided alike on every rank (same counts)
        use_ce = pair_counts is not None and self.ce.prepare(pair_counts, x.shape[1], K, config.num_sms)
        recv_x, recv_scales, recv_idx, recv_w, recv_src = dispatch_outputs(rows, x, x_scales, topk_idx)
        x, topk_idx, topk_weights = contiguous(x, topk_idx, topk_weights)
        plan = CudaNormalPlan(T, rows, C, num_recv, per_src)
        plan.num_experts = E
        plan.ce = use_ce
        outs = (recv_x, recv_scales, recv_idx, recv_w, recv_src, send_head)
        lay = self.ce.dispatch_layout_for(plan, hidden_bytes, ns, K, config.num_sms)
        if lay is not None:  # Tuning.ht_dispatch_ce (ht_ce.py)
            self.ce.dispatch(lay, x, x_scales, topk_idx, topk_weights, in_rank, outs, (rank_prefix, channel_prefix),
                             plan, config.num_sms)
        else:
            self._launch_dispatch(x, x_scales, topk_idx, topk_weights, in_rank, outs,
                                  (rank_prefix, recv_channel_prefix), C, rows)
        handle = NormalHandle((rank_prefix, channel_prefix, recv_channel_prefix, recv_src, in_rank, send_head),
                              self.ec.owner, plan)
        return recv_x, recv_scales, recv_idx, recv_w, per_expert, handle

    def cached_dispatch(self, x, x_scales, handle, config):
        self._check_x(x, x_scales)
        plan = handle.plan
        if x.shape[0] != plan.num_tokens:
            raise InvalidArgument("x", f"{plan.num_tokens} rows (the token count of the dispatch that made `handle`)",
                                  x.shape[0])
        self._ensure_geometry(plan.num_channels, config.num_max_nvl_chunked_recv_tokens)
        ns = x_scales.shape[1] if x_scales is not None else 0
        self._check_slot(dispatch_slot_bytes(x.shape[1] * x.element_size(), ns, 0), "dispatch")
        self._num_experts = plan.num_experts
        rows = plan.num_rows
        recv_x = torch.empty(rows, x.shape[1], dtype=x.dtype, device=x.device)
        recv_scales = torch.empty(rows, ns, dtype=x_scales.dtype, device=x.device) if x_scales is not None else None
        outs = (recv_x, recv_scales, None, None, None, None)
        lay = self.ce.dispatch_layout_for(plan, x.shape[1] * x.element_size(), ns, 0, config.num_sms)
        if lay is not None:  # Tuning.ht_dispatch_ce (ht_ce.py)
            self.ce.dispatch(lay, x.contiguous(), x_scales, None, None, handle[4], outs, (handle[0], handle[1]), plan,
                             config.num_sms)
        else:
            self._launch_dispatch(x.contiguous(), x_scales, None, None, handle[4], outs, (handle[0], handle[2]),
                                  plan.num_channels, rows)
        return recv_x, recv_scales

    # -- combine -----------------------------------------------------------------------------------
    def combine(self, x, handle, topk_weights, biases, config):
        plan = handle.plan
        check_combine_rows(x, plan.num_rows, topk_weights, "cuda")
        self._ensure_geometry(plan.num_channels, config.num_max_nvl_chunked_recv_tokens)
        T, H = plan.num_tokens, x.shape[1]
        K = topk_weights.shape[1] if topk_weights is not None else 0
        use_ce = self.ce.enabled and self.ce.usable(plan, x, topk_weights)
        if not use_ce:
            self._check_slot(combine_slot_bytes(H, K), "combine")
        out = torch.empty(T, H, dtype=torch.bfloat16, device=x.device)
        out_w = torch.empty(T, K, dtype=torch.float32, device=x.device) if topk_weights is not None else None
        b0, b1 = (b.contiguous() if b is not None else None for b in biases)
        x = x.contiguous()
        topk_weights = topk_weights.contiguous() if topk_weights is not None else None
        if use_ce:
            self.ce.combine(x, handle, topk_weights, b0, b1, out, out_w, config.num_sms, self.combine_smem)
            return out, out_w
        fixed = (self.peers.ptr, self._sent, self._consumed, self.ec.error_dev_ptr, T, H, K, self.R, self.rank,
                 plan.num_channels, self.geometry[1], self.slot_bytes, self.Gc, self.ec.timeout_ns)
        params = self._combine_params.pack(
            fixed, x.data_ptr(), tensor_ptr(topk_weights), tensor_ptr(b0), tensor_ptr(b1), out.data_ptr(), tensor_ptr(out_w),
            handle[4].data_ptr(), handle[5].data_ptr(), handle[0].data_ptr(), handle[2].data_ptr())
        self._k["ht_combine"].launch(2 * plan.num_channels, self.combine_block, params, current_stream(),
                                     smem=self.combine_smem)
        return out, out_w

    def free(self) -> None:
        self.ce.free()
        self.work.free()
        self.peers.free()
