"""Normal mode through the CPU proxy with several ranks per node (ht/proxy/forward_dispatch.cu,
ht/proxy/forward_combine.cu): the host executor's two-level protocol (uccl_ep/host/ht_internode.py)
on GPU warps, driven from ProxyNormalEngine (ht_proxy.py), which owns the proxy, the rings and
the notify step.

  dispatch  notify (records with the tokens per destination node) -> hop 1 once per node to the
            rail rank there -> that forwarder places its own rows and copies the others into the
            hop-2 rings of the node's ranks (area 1) -> rows in (source rank, token) order
  combine   handshake -> hop A (rows back to their forwarder, area 1) -> the forwarder's fp32 sum
            over its node (local ranks ascending) -> hop B (area 0) -> the source adds biases, then
            the nodes' partials in order
Hop 2 and hop A (ring area 1) go over NVLink into the node mates' rings when the engine mapped them
(``eng.mates_ptr``; ProxyNormalEngine._map_mates), else through the proxy like hop 1 and hop B.
"""

from __future__ import annotations

import torch

from ..errors import InvalidArgument
from ..handles import NormalHandle
from ..validate import check_combine_rows
from . import ht_proxy_plan as plan
from .runtime import contiguous, current_stream, dispatch_outputs, pack_params

__all__ = ["dispatch", "cached_dispatch", "combine"]

_BLOCK = 512
_HANDLE_BLOCK = 512   # ht/proxy/plan.cu kHandleThreads: ht_proxy_forward_handle's threads per block
_HANDLE_ROWS = 1024   # ... kHandleRows: its forwarder rows per block


def _ptr(t) -> int:
    return t.data_ptr() if t is not None else 0


def _launch_dispatch(eng, x, scales, topk_idx, topk_weights, st, outs, rows, rdma_rows, rings) -> None:
    recv_x, recv_scales, recv_idx, recv_w, recv_src, recv_mask, rdma_mask = outs
    grid, role = eng.role(3 * st.num_channels, _BLOCK)
    params = pack_params(
        "HTProxyForwardDispatchParams", x=x.data_ptr(), x_scales=_ptr(scales), topk_idx=_ptr(topk_idx),
        topk_weights=_ptr(topk_weights), is_token_in_rank=st.in_rank.data_ptr(),
        node_send_prefix=st.node_send_prefix.data_ptr(), rdma_prefix=st.rdma_prefix.data_ptr(),
        rdma_count=st.rdma_count.data_ptr(), recv_prefix=st.recv_prefix.data_ptr(), recv_end=st.recv_end.data_ptr(),
        recv_count=st.recv_count.data_ptr(), recv_x=recv_x.data_ptr(), recv_scales=_ptr(recv_scales),
        recv_topk_idx=_ptr(recv_idx), recv_topk_weights=_ptr(recv_w), recv_src_idx=_ptr(recv_src),
        recv_mask=_ptr(recv_mask), rdma_mask=_ptr(rdma_mask), num_tokens=x.shape[0],
        hidden_bytes=x.shape[1] * x.element_size(), num_scales=scales.shape[1] if scales is not None else 0,
        scale_stride_token=scales.stride(0) if scales is not None else 0,
        scale_stride_col=scales.stride(1) if scales is not None else 0,
        num_topk=topk_idx.shape[1] if topk_idx is not None else 0, num_experts=st.num_experts, num_ranks=eng.R,
        rank=eng.rank, ranks_per_node=eng.G, num_channels=st.num_channels, num_rows=rows, rdma_rows=rdma_rows,
        mates=eng.mates_ptr, **eng.proxy_words(), **rings, **role)
    eng.kernels["ht_proxy_forward_dispatch"].launch(grid, _BLOCK, params, current_stream())


def _forward_handle(eng, meta_out, cols: dict, st, rdma_end, recv_mask) -> tuple:
    """DeepEP's 10-tuple of a fresh dispatch on the device (ht/proxy/plan.cu ht_proxy_forward_handle,
    after the dispatch kernel on the same stream recorded the masks; the host reference is
    ht_proxy_plan.forward_handle, which the CPU emulator runs)."""
    R, G, C, rows, rdma_rows = eng.R, eng.G, st.num_channels, st.num_rows, st.rdma_rows
    i32 = dict(dtype=torch.int32, device=meta_out.device)
    src_meta, nvl_head = torch.empty(rows, 2, **i32), torch.empty(rdma_rows, G, **i32)
    rdma_prefix, rdma_rank_prefix = torch.empty(R // G, C, **i32), torch.empty(R // G, **i32)
    params = pack_params(
        "HTProxyForwardHandleParams", meta_out=meta_out.data_ptr(), recv_end=st.recv_end.data_ptr(),
        recv_mask=recv_mask.data_ptr(), rdma_count=st.rdma_count.data_ptr(), rdma_end=rdma_end.data_ptr(),
        rdma_mask=st.rdma_mask.data_ptr(), recv_src_meta=src_meta.data_ptr(), send_nvl_head=nvl_head.data_ptr(),
        recv_rdma_prefix=rdma_prefix.data_ptr(), rdma_rank_prefix=rdma_rank_prefix.data_ptr(), num_ranks=R,
        rank=eng.rank, ranks_per_node=G, num_channels=C, record_ints=cols["ints"], num_rows=rows,
        rdma_rows=rdma_rows)
    # a block per chunk of the forwarder's rows (send_nvl_head), then blocks over the received rows
    chunks = (rdma_rows + _HANDLE_ROWS - 1) // _HANDLE_ROWS
    row_blocks = max(1, min(1024, (rows + _HANDLE_BLOCK - 1) // _HANDLE_BLOCK))
    eng.kernels["ht_proxy_forward_handle"].launch(chunks + row_blocks, _HANDLE_BLOCK, params, current_stream())
    return (st.in_rank, st.node_send_prefix, st.send_prefix, rdma_prefix, rdma_rank_prefix, st.recv_prefix,
            st.recv_end, src_meta.view(torch.uint8).view(rows, 8), st.send_rdma_head, nvl_head)


def _dispatch_rings(eng, msg: int, channels: int, config, phase: str) -> dict:
    return dict(eng.ring(msg, channels, config, phase + " hop 1", area=0),
                **eng.ring(msg, channels, config, phase + " hop 2", area=1))


def dispatch(eng, x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
             expert_alignment, num_worst_tokens, config):
    R, dev = eng.R, x.device
    T, C, E, E_loc, K, ns = eng.check_dispatch(x, x_scales, topk_idx, num_tokens_per_expert, config)
    msg = plan.forward_msg_bytes(x.shape[1] * x.element_size(), ns, K)
    rings = _dispatch_rings(eng, msg, C, config, "dispatch")
    in_rank = is_token_in_rank.contiguous()
    cols = plan.record_columns(R, C, E_loc, node_counts=True)
    per_dst, send_prefix, _, node_send_prefix, send_rdma_head = eng.plan_send(
        in_rank, num_tokens_per_rank, num_tokens_per_expert, C, E_loc, msg, cols)
    meta_out = torch.zeros_like(per_dst)  # defined even where no notify kernel runs (CPU emulation)
    eng.last_worst = num_worst_tokens
    tag = eng.notify(per_dst, meta_out, cols, E_loc, expert_alignment, num_worst_tokens, C,
                     geometry=eng.geometry_keys(rings, C))
    if num_worst_tokens > 0:
        rows = rdma_rows = num_worst_tokens
        num_recv, per_src, per_expert = None, None, []
    else:
        vals = eng.wait_host(tag)
        num_recv, per_src, per_expert = vals[0], vals[1:1 + R], vals[1 + R:1 + R + E_loc]
        rows, rdma_rows = num_recv, vals[1 + R + E_loc]
    lay = eng.plan_recv(meta_out, send_prefix, C, cols, rows)
    st = plan.RecvLayout(num_tokens=T, num_rows=rows, num_recv=num_recv, num_channels=C, num_experts=E,
                         rdma_rows=rdma_rows, in_rank=in_rank, send_prefix=send_prefix,
                         node_send_prefix=node_send_prefix, recv_prefix=lay["recv_prefix"],
                         recv_end=lay["recv_end"], recv_count=lay["recv_count"], rdma_prefix=lay["rdma_prefix"],
                         rdma_count=lay["rdma_count"], send_rdma_head=send_rdma_head)
    recv_x, recv_scales, recv_idx, recv_w, recv_src = dispatch_outputs(rows, x, x_scales, topk_idx)
    recv_mask = torch.zeros(rows, dtype=torch.int32, device=dev)
    st.rdma_mask = torch.zeros(rdma_rows, dtype=torch.int32, device=dev)
    x, topk_idx, topk_weights = contiguous(x, topk_idx, topk_weights)
    _launch_dispatch(eng, x, x_scales, topk_idx, topk_weights, st,
                     (recv_x, recv_scales, recv_idx, recv_w, recv_src, recv_mask, st.rdma_mask), rows, rdma_rows, rings)
    items = _forward_handle(eng, meta_out, cols, st, lay["rdma_end"], recv_mask)
    state = plan.ProxyNormalPlan(recv_counts=per_src, **vars(st))
    return recv_x, recv_scales, recv_idx, recv_w, per_expert, NormalHandle(items, eng.owner, state)


def cached_dispatch(eng, x, x_scales, handle, config):
    plan.check_scales(x_scales)
    st = handle.plan
    if x.shape[0] != st.num_tokens:
        raise InvalidArgument("x", f"{st.num_tokens} rows (the token count of the dispatch that made `handle`)",
                              x.shape[0])
    ns = x_scales.shape[1] if x_scales is not None else 0
    msg = plan.forward_msg_bytes(x.shape[1] * x.element_size(), ns, 0)
    rings = _dispatch_rings(eng, msg, st.num_channels, config, "cached dispatch")
    recv_x = torch.empty(st.num_rows, x.shape[1], dtype=x.dtype, device=x.device)
    recv_scales = torch.empty(st.num_rows, ns, dtype=x_scales.dtype, device=x.device) if x_scales is not None else None
    eng.start_op(rings, st.num_channels)
    # no masks recorded (rdma_rows = 0): the dispatch that made the handle recorded them
    _launch_dispatch(eng, x.contiguous(), x_scales, None, None, st, (recv_x, recv_scales, None, None, None, None, None),
                     st.num_rows, 0, rings)
    return recv_x, recv_scales


def combine(eng, x, handle, topk_weights, biases, config):
    st = handle.plan
    check_combine_rows(x, st.num_rows, topk_weights, "cuda")
    T, H, C = st.num_tokens, x.shape[1], st.num_channels
    K = topk_weights.shape[1] if topk_weights is not None else 0
    rings = dict(eng.ring(plan.partial_msg_bytes(H, K, eng.partials_bf16), C, config, "combine hop B", area=0),
                 **eng.ring(plan.combine_msg_bytes(H, K), C, config, "combine hop A", area=1))
    eng.start_op(rings, C)
    out = torch.empty(T, H, dtype=torch.bfloat16, device=x.device)
    out_w = torch.empty(T, K, dtype=torch.float32, device=x.device) if topk_weights is not None else None
    b0, b1 = (b.contiguous() if b is not None else None for b in biases)
    x = x.contiguous()
    topk_weights = topk_weights.contiguous() if topk_weights is not None else None
    grid, role = eng.role(3 * C, _BLOCK)
    params = pack_params(
        "HTProxyForwardCombineParams", x=x.data_ptr(), topk_weights=_ptr(topk_weights), bias0=_ptr(b0), bias1=_ptr(b1),
        out=out.data_ptr(), out_weights=_ptr(out_w), send_rdma_head=st.send_rdma_head.data_ptr(),
        node_send_prefix=st.node_send_prefix.data_ptr(), rdma_prefix=st.rdma_prefix.data_ptr(),
        rdma_count=st.rdma_count.data_ptr(), rdma_mask=st.rdma_mask.data_ptr(), recv_prefix=st.recv_prefix.data_ptr(),
        recv_end=st.recv_end.data_ptr(), recv_count=st.recv_count.data_ptr(), num_tokens=T, hidden=H, num_topk=K,
        num_ranks=eng.R, rank=eng.rank, ranks_per_node=eng.G, num_channels=C, mates=eng.mates_ptr,
        partial_bf16=int(eng.partials_bf16), **eng.proxy_words(), **rings, **role)
    eng.kernels["ht_proxy_forward_combine"].launch(grid, _BLOCK, params, current_stream())
    return out, out_w
