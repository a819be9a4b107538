"""Hostile calls of every public `uccl_ep.Buffer` method on 2 CPU ranks, for the reference and host
backends: wrong types, dtypes, shapes, devices (meta), strides, ranges, NaN/inf, zero and huge
sizes, forged and mismatched handles, calls in the wrong order, concurrent calls, and stalled and
dead peers. Every rank runs the same list, so a call both ranks refuse before communicating
leaves them in step; `judges` names the ranks whose outcome counts for asymmetric cases."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import threading
import time
from dataclasses import dataclass

import torch

from . import Case

NAN, INF = math.nan, math.inf
H, E, T, K, NUM_MAX = 256, 8, 6, 2, 16
TIMEOUT_S = 3.0
BACKENDS = ("reference", "host")


@dataclass
class BufferCase(Case):
    judges: tuple = (0, 1)   # ranks whose outcome counts
    dies: int = -1           # the rank this case kills (its death is expected, not a crash)


class BufferCtx:
    """A rank's Buffers of one backend and lazily made valid inputs and handles."""

    def __init__(self, backend: str, rank: int, world: int) -> None:
        import torch.distributed as dist

        from uccl_ep import Buffer
        self.Buffer, self.G, self.backend, self.rank, self.world = Buffer, dist.group.WORLD, backend, rank, world
        nvl = Buffer.get_dispatch_config(world).get_nvl_buffer_size_hint(H * 4, world)
        nvl = (nvl + 127) // 128 * 128
        self.normal = Buffer(self.G, nvl, 0, backend=backend, explicitly_destroy=True, timeout_s=TIMEOUT_S)
        hint = Buffer.get_low_latency_rdma_size_hint(NUM_MAX, H, world, E)
        self.ll = Buffer(self.G, 0, hint, low_latency_mode=True, num_qps_per_rank=E // world, backend=backend,
                         enable_shrink=True, timeout_s=TIMEOUT_S)
        self._handle = self._ll_handle = None
        g = torch.Generator().manual_seed(rank)
        self.x = torch.randn(T, H, generator=g).bfloat16()
        self.topk = torch.rand(T, E, generator=g).topk(K, dim=1).indices
        self.w = torch.rand(T, K, generator=g)

    def layout(self, **kw):
        ntpr, ntprr, ntpe, in_rank, _ = self.normal.get_dispatch_layout(self.topk, E)
        out = dict(num_tokens_per_rank=ntpr, num_tokens_per_rdma_rank=ntprr, is_token_in_rank=in_rank,
                   num_tokens_per_expert=ntpe, topk_idx=self.topk, topk_weights=self.w)
        out.update(kw)
        return out

    def dispatch(self, x=None, **kw):
        return self.normal.dispatch(self.x if x is None else x, **self.layout(**kw))

    @property
    def handle(self):
        if self._handle is None:
            out = self.dispatch()
            self._recv = out[0]
            self._handle = out[4]
        return self._handle

    @property
    def ll_handle(self):
        if self._ll_handle is None:
            self._ll_out = self.ll.low_latency_dispatch(self.x, self.topk, NUM_MAX, E, use_fp8=False)
            self._ll_handle = self._ll_out[2]
        return self._ll_handle

    def ll_combine(self, handle=None, **kw):
        h = self.ll_handle if handle is None else handle
        args = dict(x=torch.zeros(E // self.world, self.world * NUM_MAX, H, dtype=torch.bfloat16), topk_idx=self.topk,
                    topk_weights=self.w, handle=h)
        args.update(kw)
        return self.ll.low_latency_combine(**args)


def _c(name, fn, expect=(), **kw):
    return BufferCase(name, fn, expect, **kw)


def _constructor_cases() -> list[BufferCase]:
    from uccl_ep.errors import LimitExceeded, Unsupported

    def build(**kw):
        def fn(ctx):
            args = dict(group=ctx.G, num_nvl_bytes=0, num_rdma_bytes=0, backend=ctx.backend, timeout_s=TIMEOUT_S)
            args.update(kw)
            ctx.Buffer(**args)
        return fn
    out = [_c("Buffer(group=None)", build(group=None)), _c("Buffer(group='x')", build(group="x")),
           _c("Buffer(group=None, comm=object())", build(group=None, comm=object()), Unsupported),
           _c("Buffer(num_nvl_bytes=100)", build(num_nvl_bytes=100)),
           _c("Buffer(num_nvl_bytes=-128)", build(num_nvl_bytes=-128)),
           _c("Buffer(num_nvl_bytes=2**40)", build(num_nvl_bytes=2**40), LimitExceeded),
           _c("Buffer(num_nvl_bytes=1.5)", build(num_nvl_bytes=1.5)),
           _c("Buffer(num_rdma_bytes=-1)", build(num_rdma_bytes=-1)),
           _c("Buffer(num_rdma_bytes=nan)", build(num_rdma_bytes=NAN)),
           _c("Buffer(low_latency_mode='yes')", build(low_latency_mode="yes")),
           _c("Buffer(num_qps_per_rank=0)", build(num_qps_per_rank=0)),
           _c("Buffer(explicitly_destroy=2)", build(explicitly_destroy=2)),
           _c("Buffer(enable_shrink='y')", build(enable_shrink="y")),
           _c("Buffer(timeout_s=0)", build(timeout_s=0)), _c("Buffer(timeout_s=-1)", build(timeout_s=-1)),
           _c("Buffer(timeout_s='5')", build(timeout_s="5")), _c("Buffer(gpu_timeout_s=0)", build(gpu_timeout_s=0)),
           _c("Buffer(num_proxy_threads=0)", build(num_proxy_threads=0)),
           _c("Buffer(num_proxy_threads=10**6)", build(num_proxy_threads=10**6), LimitExceeded),
           _c("Buffer(num_proxy_threads='2')", build(num_proxy_threads="2")),
           _c("Buffer(ranks_per_node=-1)", build(ranks_per_node=-1)),
           _c("Buffer(some_fork_feature=True)", build(some_fork_feature=True), Unsupported),
           _c("Buffer(backend='gpu-magic')", build(backend="gpu-magic"))]
    B = lambda ctx: ctx.Buffer  # noqa: E731
    out += [_c("Buffer.set_num_sms(3)", lambda ctx: B(ctx).set_num_sms(3)),
            _c("Buffer.set_num_sms(0)", lambda ctx: B(ctx).set_num_sms(0)),
            _c("Buffer.set_num_sms(nan)", lambda ctx: B(ctx).set_num_sms(NAN)),
            _c("Buffer.get_dispatch_config(0)", lambda ctx: B(ctx).get_dispatch_config(0)),
            _c("Buffer.get_combine_config('x')", lambda ctx: B(ctx).get_combine_config("x")),
            _c("get_low_latency_rdma_size_hint(num_max=0)", lambda ctx: B(ctx).get_low_latency_rdma_size_hint(0, H, 2, E)),
            _c("get_low_latency_rdma_size_hint(hidden=-1)", lambda ctx: B(ctx).get_low_latency_rdma_size_hint(16, -1, 2, E)),
            _c("get_low_latency_rdma_size_hint(num_ranks=inf)",
               lambda ctx: B(ctx).get_low_latency_rdma_size_hint(16, H, INF, E)),
            _c("Config(num_sms=0)", lambda ctx: __import__("uccl_ep").Config(0, 1, 1, 1, 1)),
            _c("Config(nvl send tokens=-1)", lambda ctx: __import__("uccl_ep").Config(20, -1, 8, 1, 1))]
    gl = lambda ctx, **kw: ctx.normal.get_local_buffer_tensor(**dict(dict(dtype=torch.float32), **kw))  # noqa: E731
    out += [_c("get_local_buffer_tensor(dtype='x')", lambda ctx: gl(ctx, dtype="x")),
            _c("get_local_buffer_tensor(offset=-1)", lambda ctx: gl(ctx, offset=-1)),
            _c("get_local_buffer_tensor(offset=3, float32)", lambda ctx: gl(ctx, offset=3)),
            _c("get_local_buffer_tensor(offset=inf)", lambda ctx: gl(ctx, offset=INF)),
            _c("get_local_buffer_tensor(size past the end)", lambda ctx: gl(ctx, size=(1 << 40,)), LimitExceeded),
            _c("destroy() without explicitly_destroy", lambda ctx: ctx.ll.destroy())]
    return out


def _normal_cases() -> list[BufferCase]:
    from uccl_ep.errors import LimitExceeded
    from uccl_ep.handles import LowLatencyHandle, NormalHandle
    meta = lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")  # noqa: E731
    gdl = lambda ctx, topk, e=E, **kw: ctx.normal.get_dispatch_layout(topk, e, **kw)  # noqa: E731
    out = [_c("get_dispatch_layout(topk int32)", lambda ctx: gdl(ctx, ctx.topk.int())),
           _c("get_dispatch_layout(topk 1-D)", lambda ctx: gdl(ctx, ctx.topk[:, 0])),
           _c("get_dispatch_layout(topk 3-D)", lambda ctx: gdl(ctx, ctx.topk[None])),
           _c("get_dispatch_layout(topk non-contiguous)", lambda ctx: gdl(ctx, torch.zeros(K, T, dtype=torch.int64).t())),
           _c("get_dispatch_layout(topk on meta)", lambda ctx: gdl(ctx, meta(ctx.topk))),
           _c("get_dispatch_layout(topk sparse)", lambda ctx: gdl(ctx, ctx.topk.to_sparse())),
           _c("get_dispatch_layout(expert id == E)", lambda ctx: gdl(ctx, torch.full((T, K), E))),
           _c("get_dispatch_layout(expert id -2)", lambda ctx: gdl(ctx, torch.full((T, K), -2))),
           _c("get_dispatch_layout(num_experts=0)", lambda ctx: gdl(ctx, ctx.topk, 0)),
           _c("get_dispatch_layout(num_experts=2**36)", lambda ctx: gdl(ctx, ctx.topk, 2**36), LimitExceeded),
           _c("get_dispatch_layout(num_experts=7)", lambda ctx: gdl(ctx, ctx.topk, 7)),
           _c("get_dispatch_layout(num_experts=8.0)", lambda ctx: gdl(ctx, ctx.topk, 8.0)),
           _c("get_dispatch_layout(num_experts=nan)", lambda ctx: gdl(ctx, ctx.topk, NAN)),
           _c("get_dispatch_layout(previous_event='x')", lambda ctx: gdl(ctx, ctx.topk, previous_event="x")),
           _c("get_dispatch_layout(async_finish=2)", lambda ctx: gdl(ctx, ctx.topk, async_finish=2)),
           _c("get_dispatch_layout(allocate_on_comm_stream without event)",
              lambda ctx: gdl(ctx, ctx.topk, allocate_on_comm_stream=True)),
           _c("get_dispatch_layout(topk_idx=None)", lambda ctx: gdl(ctx, None)),
           _c("get_dispatch_layout(topk a list)", lambda ctx: gdl(ctx, [[0, 1]] * T))]
    d = lambda ctx, x=None, **kw: ctx.dispatch(x, **kw)  # noqa: E731
    f8 = lambda ctx: (ctx.x.float().to(torch.float8_e4m3fn), torch.ones(T, H // 128))  # noqa: E731
    out += [_c("dispatch(x 3-D)", lambda ctx: d(ctx, ctx.x[None])),
            _c("dispatch(x 1-D)", lambda ctx: d(ctx, ctx.x[0])),
            _c("dispatch(x hidden 0)", lambda ctx: d(ctx, torch.zeros(T, 0, dtype=torch.bfloat16))),
            _c("dispatch(x rows of 6 bytes)", lambda ctx: d(ctx, torch.zeros(T, 3, dtype=torch.bfloat16))),
            _c("dispatch(x on meta)", lambda ctx: d(ctx, meta(ctx.x))),
            _c("dispatch(x=None)", lambda ctx: ctx.normal.dispatch(None, **ctx.layout())),
            _c("dispatch(x non-contiguous)", lambda ctx: d(ctx, torch.zeros(H, T, dtype=torch.bfloat16).t())),
            _c("dispatch((bf16, scales))", lambda ctx: d(ctx, (ctx.x, torch.ones(T, H // 128)))),
            _c("dispatch((fp8, scales, extra))", lambda ctx: d(ctx, (*f8(ctx), ctx.x))),
            _c("dispatch((fp8, scales of other rows))", lambda ctx: d(ctx, (f8(ctx)[0], torch.ones(T + 1, H // 128)))),
            _c("dispatch((fp8, bf16 scales))", lambda ctx: d(ctx, (f8(ctx)[0], torch.ones(T, 2).bfloat16()))),
            _c("dispatch((fp8, scales on meta))", lambda ctx: d(ctx, (f8(ctx)[0], meta(f8(ctx)[1])))),
            _c("dispatch(no num_tokens_per_rank)", lambda ctx: d(ctx, num_tokens_per_rank=None)),
            _c("dispatch(num_tokens_per_rank int64)",
               lambda ctx: d(ctx, num_tokens_per_rank=ctx.layout()["num_tokens_per_rank"].long())),
            _c("dispatch(num_tokens_per_rank of 3 ranks)", lambda ctx: d(ctx, num_tokens_per_rank=torch.zeros(3, dtype=torch.int32))),
            _c("dispatch(is_token_in_rank int)",
               lambda ctx: d(ctx, is_token_in_rank=ctx.layout()["is_token_in_rank"].int())),
            _c("dispatch(is_token_in_rank of other rows)",
               lambda ctx: d(ctx, is_token_in_rank=torch.zeros(T + 2, ctx.world, dtype=torch.bool))),
            _c("dispatch(num_tokens_per_expert 2-D)",
               lambda ctx: d(ctx, num_tokens_per_expert=torch.zeros(1, E, dtype=torch.int32))),
            _c("dispatch(num_tokens_per_expert of 7 experts)",
               lambda ctx: d(ctx, num_tokens_per_expert=torch.zeros(7, dtype=torch.int32))),
            _c("dispatch(topk_weights without topk_idx)", lambda ctx: d(ctx, topk_idx=None)),
            _c("dispatch(topk_idx of other rows)", lambda ctx: d(ctx, topk_idx=ctx.topk[:-1], topk_weights=ctx.w[:-1])),
            _c("dispatch(topk_weights float16)", lambda ctx: d(ctx, topk_weights=ctx.w.half())),
            _c("dispatch(topk_weights of another shape)", lambda ctx: d(ctx, topk_weights=ctx.w[:, :1].contiguous())),
            _c("dispatch(topk_idx out of range)", lambda ctx: d(ctx, topk_idx=torch.full((T, K), 99))),
            _c("dispatch(expert_alignment=0)", lambda ctx: d(ctx, expert_alignment=0)),
            _c("dispatch(num_worst_tokens=-1)", lambda ctx: d(ctx, num_worst_tokens=-1)),
            _c("dispatch(num_worst_tokens without topk)", lambda ctx: d(ctx, num_worst_tokens=4, topk_idx=None,
                                                                         topk_weights=None)),
            _c("dispatch(config='cfg')", lambda ctx: d(ctx, config="cfg")),
            _c("dispatch(handle=a tuple)", lambda ctx: ctx.normal.dispatch(ctx.x, handle=tuple(ctx.handle))),
            _c("dispatch(handle built by hand)",
               lambda ctx: ctx.normal.dispatch(ctx.x, handle=NormalHandle(tuple(ctx.handle), ctx.normal, None))),
            _c("dispatch(handle with an item replaced)", lambda ctx: ctx.normal.dispatch(ctx.x, handle=NormalHandle(
                (ctx.handle[0].clone(), *ctx.handle[1:]), ctx.normal, ctx.handle.plan))),
            _c("dispatch(handle of a low-latency dispatch)", lambda ctx: ctx.normal.dispatch(ctx.x, handle=ctx.ll_handle)),
            _c("dispatch(handle of another Buffer)", lambda ctx: ctx.normal.dispatch(ctx.x, handle=NormalHandle(
                tuple(ctx.handle), ctx.ll, ctx.handle.plan))),
            _c("dispatch(handle and topk_idx)", lambda ctx: ctx.normal.dispatch(ctx.x, handle=ctx.handle, topk_idx=ctx.topk)),
            _c("dispatch(handle and num_worst_tokens)",
               lambda ctx: ctx.normal.dispatch(ctx.x, handle=ctx.handle, num_worst_tokens=8))]
    cb = lambda ctx, x=None, **kw: ctx.normal.combine(  # noqa: E731
        torch.zeros(ctx._recv.shape[0] if ctx.handle is not None else 0, H) if x is None else x,
        **dict(dict(handle=ctx.handle), **kw))
    out += [_c("combine(x int32)", lambda ctx: cb(ctx, torch.zeros(4, H, dtype=torch.int32))),
            _c("combine(x 1-D)", lambda ctx: cb(ctx, torch.zeros(H))),
            _c("combine(x hidden 0)", lambda ctx: cb(ctx, torch.zeros(4, 0))),
            _c("combine(x on meta)", lambda ctx: cb(ctx, torch.zeros(4, H, device="meta"))),
            _c("combine(handle=None)", lambda ctx: cb(ctx, handle=None)),
            _c("combine(handle=a tuple)", lambda ctx: cb(ctx, handle=tuple(ctx.handle))),
            _c("combine(handle of a low-latency dispatch)", lambda ctx: cb(ctx, handle=ctx.ll_handle)),
            _c("combine(handle with an item replaced)", lambda ctx: cb(ctx, handle=NormalHandle(
                (*ctx.handle[:-1], ctx.handle[-1].clone()), ctx.normal, ctx.handle.plan))),
            _c("combine(handle built by hand)", lambda ctx: cb(ctx, handle=NormalHandle(
                tuple(ctx.handle), ctx.normal, type(ctx.handle.plan).__new__(type(ctx.handle.plan))))),
            _c("combine(topk_weights int)", lambda ctx: cb(ctx, topk_weights=torch.zeros(4, K, dtype=torch.int32))),
            _c("combine(topk_weights 1-D)", lambda ctx: cb(ctx, topk_weights=torch.zeros(4))),
            _c("combine(three biases)", lambda ctx: cb(ctx, bias=(torch.zeros(T, H),) * 3)),
            _c("combine(bias of another shape)", lambda ctx: cb(ctx, bias=torch.zeros(T + 1, H))),
            _c("combine(bias of another dtype)", lambda ctx: cb(ctx, bias=torch.zeros(T, H, dtype=torch.float64))),
            _c("combine(config=5)", lambda ctx: cb(ctx, config=5)),
            _c("combine(async_finish='no')", lambda ctx: cb(ctx, async_finish="no"))]
    del LowLatencyHandle
    return out


def _ll_cases() -> list[BufferCase]:
    from uccl_ep.errors import LimitExceeded, Unsupported
    from uccl_ep.handles import LowLatencyHandle
    meta = lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")  # noqa: E731

    def lld(ctx, x=None, topk=None, num_max=NUM_MAX, e=E, **kw):
        return ctx.ll.low_latency_dispatch(ctx.x if x is None else x, ctx.topk if topk is None else topk, num_max, e,
                                           **dict(dict(use_fp8=False), **kw))
    out = [_c("low_latency_dispatch(x float32)", lambda ctx: lld(ctx, ctx.x.float())),
           _c("low_latency_dispatch(x 1-D)", lambda ctx: lld(ctx, ctx.x[0])),
           _c("low_latency_dispatch(hidden 100)", lambda ctx: lld(ctx, torch.zeros(T, 100, dtype=torch.bfloat16))),
           _c("low_latency_dispatch(hidden 0)", lambda ctx: lld(ctx, torch.zeros(T, 0, dtype=torch.bfloat16))),
           _c("low_latency_dispatch(x on meta)", lambda ctx: lld(ctx, meta(ctx.x))),
           _c("low_latency_dispatch(more tokens than num_max)",
              lambda ctx: lld(ctx, torch.zeros(NUM_MAX + 1, H, dtype=torch.bfloat16),
                              torch.zeros(NUM_MAX + 1, K, dtype=torch.int64)), LimitExceeded),
           _c("low_latency_dispatch(num_max=0)", lambda ctx: lld(ctx, num_max=0)),
           _c("low_latency_dispatch(num_max=nan)", lambda ctx: lld(ctx, num_max=NAN)),
           _c("low_latency_dispatch(num_max=10**6)", lambda ctx: lld(ctx, num_max=10**6), LimitExceeded),
           _c("low_latency_dispatch(num_experts=7)", lambda ctx: lld(ctx, e=7)),
           _c("low_latency_dispatch(num_experts=2**36)", lambda ctx: lld(ctx, e=2**36), LimitExceeded),
           _c("low_latency_dispatch(num_experts='8')", lambda ctx: lld(ctx, e="8")),
           _c("low_latency_dispatch(topk int32)", lambda ctx: lld(ctx, topk=ctx.topk.int())),
           _c("low_latency_dispatch(topk of other rows)", lambda ctx: lld(ctx, topk=ctx.topk[:-1])),
           _c("low_latency_dispatch(expert id 99)", lambda ctx: lld(ctx, topk=torch.full((T, K), 99))),
           _c("low_latency_dispatch(expert id -2)", lambda ctx: lld(ctx, topk=torch.full((T, K), -2))),
           _c("low_latency_dispatch(use_ue8m0 without round_scale)", lambda ctx: lld(ctx, use_fp8=True, use_ue8m0=True)),
           _c("low_latency_dispatch(use_fp8='yes')", lambda ctx: lld(ctx, use_fp8="yes")),
           _c("low_latency_dispatch(async_finish and hook)", lambda ctx: lld(ctx, async_finish=True, return_recv_hook=True)),
           _c("low_latency_dispatch(recv stats int64)", lambda ctx: lld(
               ctx, cumulative_local_expert_recv_stats=torch.zeros(E // 2, dtype=torch.int64))),
           _c("low_latency_dispatch(recv stats of 3 experts)", lambda ctx: lld(
               ctx, cumulative_local_expert_recv_stats=torch.zeros(3, dtype=torch.int32))),
           _c("low_latency_dispatch(wait stats int32)", lambda ctx: lld(
               ctx, dispatch_wait_recv_cost_stats=torch.zeros(2, dtype=torch.int32))),
           _c("low_latency_dispatch(use_nvfp4=True)", lambda ctx: lld(ctx, use_nvfp4=True), Unsupported),
           _c("low_latency_dispatch on a normal-mode Buffer", lambda ctx: ctx.normal.low_latency_dispatch(
               ctx.x, ctx.topk, NUM_MAX, E))]
    llc = lambda ctx, **kw: ctx.ll_combine(**kw)  # noqa: E731
    bad_x = lambda ctx, shape, dtype=torch.bfloat16: torch.zeros(*shape, dtype=dtype)  # noqa: E731
    out += [_c("low_latency_combine(handle=a tuple)", lambda ctx: llc(ctx, handle=tuple(ctx.ll_handle))),
            _c("low_latency_combine(handle built by hand)", lambda ctx: llc(ctx, handle=LowLatencyHandle(
                (torch.zeros(E // 2, 2 * NUM_MAX, dtype=torch.int32), torch.zeros(E // 2, 2, dtype=torch.int64),
                 NUM_MAX, H, E), ctx.ll, None))),
            _c("low_latency_combine(handle with num_max replaced)", lambda ctx: llc(ctx, handle=LowLatencyHandle(
                (*ctx.ll_handle[:2], 10**6, *ctx.ll_handle[3:]), ctx.ll, ctx.ll_handle.plan))),
            _c("low_latency_combine(normal handle)", lambda ctx: llc(ctx, handle=ctx.handle)),
            _c("low_latency_combine(x of another shape)", lambda ctx: llc(ctx, x=bad_x(ctx, (1, 2, H)))),
            _c("low_latency_combine(x float32)",
               lambda ctx: llc(ctx, x=bad_x(ctx, (E // 2, 2 * NUM_MAX, H), torch.float32))),
            _c("low_latency_combine(topk_weights of another shape)", lambda ctx: llc(ctx, topk_weights=ctx.w[:, :1])),
            _c("low_latency_combine(topk_idx of other rows)",
               lambda ctx: llc(ctx, topk_idx=ctx.topk[:-1], topk_weights=ctx.w[:-1])),
            _c("low_latency_combine(use_logfmt=True, zero_copy=True)",
               lambda ctx: llc(ctx, use_logfmt=True, zero_copy=True)),
            _c("low_latency_combine(out float32)", lambda ctx: llc(ctx, out=torch.zeros(T, H))),
            _c("low_latency_combine(out of another shape)", lambda ctx: llc(ctx, out=bad_x(ctx, (T, H + 128)))),
            _c("low_latency_combine(wait stats float)",
               lambda ctx: llc(ctx, combine_wait_recv_cost_stats=torch.zeros(2))),
            _c("low_latency_combine(async_finish and hook)", lambda ctx: llc(ctx, async_finish=True, return_recv_hook=True)),
            _c("get_next_low_latency_combine_buffer(a tuple)",
               lambda ctx: ctx.ll.get_next_low_latency_combine_buffer(tuple(ctx.ll_handle))),
            _c("get_next_low_latency_combine_buffer(normal handle)",
               lambda ctx: ctx.ll.get_next_low_latency_combine_buffer(ctx.handle)),
            _c("clean_low_latency_buffer(hidden=100)", lambda ctx: ctx.ll.clean_low_latency_buffer(NUM_MAX, 100, E)),
            _c("clean_low_latency_buffer(num_max=0)", lambda ctx: ctx.ll.clean_low_latency_buffer(0, H, E)),
            _c("clean_low_latency_buffer(num_experts=7)", lambda ctx: ctx.ll.clean_low_latency_buffer(NUM_MAX, H, 7)),
            _c("clean_low_latency_buffer(hidden='256')", lambda ctx: ctx.ll.clean_low_latency_buffer(NUM_MAX, "256", E)),
            _c("low_latency_update_mask_buffer(rank 5)", lambda ctx: ctx.ll.low_latency_update_mask_buffer(5, True)),
            _c("low_latency_update_mask_buffer(rank -1)", lambda ctx: ctx.ll.low_latency_update_mask_buffer(-1, True)),
            _c("low_latency_update_mask_buffer(rank '1')", lambda ctx: ctx.ll.low_latency_update_mask_buffer("1", True)),
            _c("low_latency_query_mask_buffer(int64)",
               lambda ctx: ctx.ll.low_latency_query_mask_buffer(torch.zeros(2, dtype=torch.int64))),
            _c("low_latency_query_mask_buffer(3 entries)",
               lambda ctx: ctx.ll.low_latency_query_mask_buffer(torch.zeros(3, dtype=torch.int32))),
            _c("low_latency_update_mask_buffer without enable_shrink",
               lambda ctx: ctx.normal.low_latency_update_mask_buffer(1, True)),
            _c("low_latency_clean_mask_buffer without enable_shrink",
               lambda ctx: ctx.normal.low_latency_clean_mask_buffer())]
    return out


def _order_cases() -> list[BufferCase]:
    from uccl_ep.errors import PeerFailure, Timeout

    def hook_twice(ctx):
        hook = ctx.ll.low_latency_dispatch(ctx.x, ctx.topk, NUM_MAX, E, use_fp8=False, return_recv_hook=True)[4]
        hook()
        hook()

    def after_destroy(ctx):
        b = ctx.Buffer(ctx.G, ctx.normal.num_nvl_bytes, 0, backend=ctx.backend, explicitly_destroy=True,
                       timeout_s=TIMEOUT_S)
        b.destroy()
        b.get_dispatch_layout(ctx.topk, E)

    def concurrent(ctx):
        """Rank 0 enters a dispatch that waits for rank 1 (which starts it 1 s later); a second call
        on the same Buffer from another thread meanwhile must be refused at once."""
        done = {}

        def first():
            try:
                done["out"] = ctx.ll.low_latency_dispatch(ctx.x, ctx.topk, NUM_MAX, E, use_fp8=False)
            except BaseException as e:  # noqa: BLE001
                done["error"] = e
        if ctx.rank == 1:
            time.sleep(1.0)
            first()
            return
        t = threading.Thread(target=first)
        t.start()
        time.sleep(0.3)
        try:
            ctx.ll.low_latency_dispatch(ctx.x, ctx.topk, NUM_MAX, E, use_fp8=False)
        finally:
            t.join(30)
            if "error" in done:
                raise done["error"]
    out = [_c("recv hook called twice", hook_twice), _c("a call after destroy()", after_destroy),
           _c("a second call while another thread is inside one", concurrent, judges=(0,))]

    # NOTES: normal mode, on a Buffer of their own: low-latency mode with enable_shrink masks a
    # silent or dead rank and completes (that is shrink's contract, tested with it), normal mode
    # raises on every survivor.
    def fresh(ctx):
        return ctx.Buffer(ctx.G, ctx.normal.num_nvl_bytes, 0, backend=ctx.backend, timeout_s=TIMEOUT_S)

    def stalled(ctx):
        """Rank 1 stops calling (a stalled peer): rank 0's dispatch ends in a typed error within
        its timeout instead of waiting."""
        buf = fresh(ctx)
        if ctx.rank == 1:
            time.sleep(2.5 * TIMEOUT_S)
            return
        buf.dispatch(ctx.x, **ctx.layout())

    def dead(ctx):
        """Rank 1 is killed (SIGKILL): rank 0's dispatch raises PeerFailure instead of hanging."""
        buf = fresh(ctx)
        if ctx.rank == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        buf.dispatch(ctx.x, **ctx.layout())
    out += [_c("a stalled peer", stalled, (Timeout, PeerFailure), judges=(0,)),
            _c("a killed peer", dead, (PeerFailure, Timeout), judges=(0,), dies=1)]
    return out


def reference_bounds_waits() -> bool:
    """Whether the reference backend bounds its waits on a stalled or dead peer (its collectives
    over the store with the Buffer's timeout, uccl_ep.group_store); before that it waits in gloo."""
    return importlib.util.find_spec("uccl_ep.group_store") is not None


def cases(backend: str) -> list[BufferCase]:
    out = _constructor_cases() + _normal_cases() + _ll_cases() + _order_cases()
    if backend == "reference" and not reference_bounds_waits():
        out = [c for c in out if c.name not in ("a stalled peer", "a killed peer")]
    return out
