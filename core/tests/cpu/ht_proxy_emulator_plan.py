"""The CPU stand-in for ht/proxy/plan.cu (a fresh dispatch's plan, one rank per node, a forced proxy
on one node, or several ranks per node with forwarding), for the emulator (ht_proxy_emulator.py): it
runs the host reference of each matrix (uccl_ep.cuda.ht_proxy_plan: channel_counts, records,
send_head, recv_layout and the handle builders) on the tensors the launch points at, so the
engine's wiring of the kernels -- which buffers, which shapes, which handle items come from where --
is checked end to end on CPU, bitwise against uccl_ep.refs. core/tests/gpu/test_cuda_ht_internode.py
checks the kernels themselves against the same references.
"""

from __future__ import annotations

import numpy as np
import torch

from ht_proxy_emulator import mem
from uccl_ep.cuda import ht_proxy_plan as plan


def _i32(addr: int, *shape: int) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    return mem(addr, 4 * n, np.int32).reshape(shape)


class PlanKernels:
    def ht_proxy_plan_send(self, p: dict) -> None:
        T, R, Cn, E_loc, L = p["num_tokens"], p["num_ranks"], p["num_channels"], p["num_local_experts"], p["record_ints"]
        in_rank = torch.from_numpy(mem(p["is_token_in_rank"], T * R, np.uint8).reshape(T, R).astype(bool))
        per_rank = torch.from_numpy(_i32(p["num_tokens_per_rank"], R).copy())
        per_expert = torch.from_numpy(_i32(p["num_tokens_per_expert"], R * E_loc).copy())
        G = p["ranks_per_node"]
        counts = plan.channel_counts(in_rank, Cn)
        node_counts = None
        if G > 1:  # forwarding: the node columns too
            in_node = plan.node_mask(in_rank, G)
            node_counts = plan.channel_counts(in_node, Cn)
            _i32(p["node_send_prefix"], R // G, Cn)[:] = node_counts.cumsum(1).numpy()
            if T:
                _i32(p["send_rdma_head"], T, R // G)[:] = plan.send_head(in_node).numpy()
        records, cols = plan.records(per_rank, counts, per_expert, p["msg_bytes"], node_counts)
        assert cols["ints"] == L and cols["node"] == p["node_col"], (cols, L, p["node_col"])
        mem(p["records"], 8 * R * L, np.int64)[:] = records.numpy().reshape(-1)
        _i32(p["send_prefix"], R, Cn)[:] = counts.cumsum(1).numpy()
        if T:
            _i32(p["send_head"], T, R)[:] = plan.send_head(in_rank).numpy()

    def ht_proxy_plan_recv(self, p: dict) -> None:
        R, me, Cn, L, rows = p["num_ranks"], p["rank"], p["num_channels"], p["record_ints"], p["num_rows"]
        meta = torch.from_numpy(mem(p["meta_out"], 8 * R * L, np.int64).reshape(R, L).copy())
        G = p["ranks_per_node"]
        lay = plan.recv_layout(meta, me, Cn, p["node_col"], G)
        _i32(p["recv_prefix"], R, Cn)[:] = lay.recv_prefix.numpy()
        _i32(p["recv_end"], R)[:] = lay.recv_end.numpy()
        if p["recv_count"]:
            _i32(p["recv_count"], R, Cn)[:] = lay.recv_count.numpy()
        if p["node_col"] >= 0:  # the forwarder's rows from each node's rail source
            _i32(p["rdma_count"], R // G, Cn)[:] = lay.rdma_count.numpy()
            _i32(p["rdma_end"], R // G)[:] = lay.rdma_end.numpy()
            _i32(p["rdma_prefix"], R // G, Cn)[:] = lay.rdma_prefix.numpy()
        send_prefix = torch.from_numpy(_i32(p["send_prefix"], R, Cn).copy())
        if p["rank_prefix"]:  # the intranode 6-tuple's rank prefix matrix
            _i32(p["rank_prefix"], R, R)[:] = plan.intranode_handle(lay, send_prefix, None, None, None)[0].numpy()
        if p["send_prefix_copy"]:  # the internode 10-tuple (one rank per node; no rows: empty tensors at 0)
            items = plan.internode_handle(lay, send_prefix, torch.zeros(0, R, dtype=torch.bool),
                                          torch.zeros(0, R, dtype=torch.int32), rows)
            _i32(p["send_prefix_copy"], R, Cn)[:] = items[1].numpy()
            _i32(p["channel_prefix"], R, Cn)[:] = items[3].numpy()
            _i32(p["recv_end_copy"], R)[:] = items[4].numpy()
            if rows:
                _i32(p["recv_src_meta"], rows, 2)[:] = items[7].view(torch.int32).view(rows, 2).numpy()
                _i32(p["nvl_head"], rows)[:] = items[9].view(-1).numpy()

    def ht_proxy_forward_handle(self, p: dict) -> None:
        """The handle items of a fresh dispatch with forwarding (ht_proxy_plan.forward_handle), from the
        records, the receive layout and the masks the dispatch recorded; the items it only passes
        through (send prefixes, heads, the token mask) are the engine's own tensors."""
        R, G, Cn, L = p["num_ranks"], p["ranks_per_node"], p["num_channels"], p["record_ints"]
        rows, rdma_rows, N = p["num_rows"], p["rdma_rows"], R // G
        meta = torch.from_numpy(mem(p["meta_out"], 8 * R * L, np.int64).reshape(R, L).copy())
        lay = plan.RecvLayout(counts=meta[:, :R], recv_end=torch.from_numpy(_i32(p["recv_end"], R).copy()),
                              rdma_count=torch.from_numpy(_i32(p["rdma_count"], N, Cn).copy()),
                              rdma_end=torch.from_numpy(_i32(p["rdma_end"], N).copy()), recv_prefix=None)
        recv_mask = torch.from_numpy(_i32(p["recv_mask"], rows).copy())
        rdma_mask = torch.from_numpy(_i32(p["rdma_mask"], rdma_rows).copy())
        items = plan.forward_handle(lay, None, None, torch.zeros(0, R, dtype=torch.bool), None, recv_mask, rdma_mask,
                                    p["rank"], G, rows, rdma_rows)
        _i32(p["recv_src_meta"], rows, 2)[:] = items[7].view(torch.int32).view(rows, 2).numpy()
        _i32(p["send_nvl_head"], rdma_rows, G)[:] = items[9].numpy()
        _i32(p["recv_rdma_prefix"], N, Cn)[:] = items[3].numpy()
        _i32(p["rdma_rank_prefix"], N)[:] = items[4].numpy()
