"""Diagnostic (GPU, 2+ GPUs): the open internode bug -- skewed routing (every token to rank 0's
experts) with num_worst_tokens = world * T, where the cached dispatch differed from the reference on
rank 0 while the fresh dispatch matched. For each config and for several ways of sequencing the
fresh and cached calls, BF16 and FP8 rows, prints how many rows of the cached output differ from the (verified) fresh
output, which rows, and what they hold instead (zeros, another fresh row, or something else).

Run: CUDA_MODULE_LOADING=EAGER python tools/lab/diag_internode_worst.py [T] [H]
"""

from __future__ import annotations

import itertools
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "core", "tests"))  # multirank
from multirank import run_ranks  # noqa: E402


def _describe(got, want, n):
    got, want = got[:n].cpu().view(torch.uint8), want[:n].cpu().view(torch.uint8)
    bad = (got != want).any(1).nonzero().flatten().tolist()
    if not bad:
        return "equal"
    index = {bytes(want[i].numpy().tobytes()): i for i in range(n)}
    kinds = []
    for r in bad[:8]:
        row = got[r]
        if not row.any():
            kinds.append(f"{r}:zero")
        elif bytes(row.numpy().tobytes()) in index:
            kinds.append(f"{r}:=fresh[{index[bytes(row.numpy().tobytes())]}]")
        else:
            same = int((row == want[r]).sum())
            kinds.append(f"{r}:other({same}/{row.numel()} equal)")
    return f"{len(bad)} of {n} rows differ (first {bad[0]}, last {bad[-1]}): " + " ".join(kinds)


def worker(rank, world, H, T, E):
    from uccl_ep import Buffer, Config
    dev = torch.device("cuda", torch.cuda.current_device())
    configs = [Buffer.get_dispatch_config(world), Config(8, 4, 32, 2, 8)]
    nvl = max(c.get_nvl_buffer_size_hint(H * 2, world) for c in configs)
    buf = Buffer(dist.group.WORLD, nvl, 0, backend="cuda", ranks_per_node=1)
    gen = torch.Generator().manual_seed(11 + rank)
    lines = []
    from uccl_ep.refs.fp8 import per_token_cast_to_fp8
    for ci, config in enumerate(configs):
        for order, label in itertools.product(("as-test", "sync-between", "cached-twice", "no-worst"), ("bf16", "fp8")):
            x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
            if label == "fp8":  # FP8 rows with column-major scales, as the test passes them
                q, sc = per_token_cast_to_fp8(x)
                x = (q, sc.t().contiguous().t())
            idx = torch.stack([torch.randperm(E // world, generator=gen)[:8] for _ in range(T)]).to(dev)
            w = torch.rand(T, 8, generator=gen).to(dev)
            lay = buf.get_dispatch_layout(idx, E)
            worst = 0 if order == "no-worst" else world * T
            kw = dict(num_tokens_per_rank=lay[0], num_tokens_per_rdma_rank=lay[1], is_token_in_rank=lay[3],
                      num_tokens_per_expert=lay[2], config=config, num_worst_tokens=worst, expert_alignment=2,
                      topk_idx=idx, topk_weights=w)
            prev = buf.capture()
            go = buf.dispatch(x, previous_event=prev, async_finish=True, allocate_on_comm_stream=True, **kw)
            go[5].current_stream_wait()
            if order == "sync-between":
                torch.cuda.synchronize()
                dist.barrier()
            first = (lambda t: t[0]) if label == "fp8" else (lambda t: t)  # noqa: E731
            fresh = first(go[0]).clone()
            per_src = [torch.zeros(world, dtype=torch.int64, device=dev) for _ in range(world)]
            dist.all_gather(per_src, lay[0].to(torch.int64))
            n = int(sum(int(t[rank].item()) for t in per_src))  # rows this rank receives
            c1 = first(buf.dispatch(x, handle=go[4], config=config)[0])
            torch.cuda.synchronize()
            msg = f"rank {rank} cfg {ci} {order} {label}: rows {go[0].shape[0]} received {n}: cached vs fresh: " + \
                _describe(c1, fresh, n)
            if order == "cached-twice":
                c2 = first(buf.dispatch(x, handle=go[4], config=config)[0])
                torch.cuda.synchronize()
                msg += " | second cached: " + _describe(c2, fresh, n)
            lines.append(msg)
            dist.barrier()
    buf._executor.check_error()
    dist.barrier()
    return lines


if __name__ == "__main__":
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    H = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    world = min(torch.cuda.device_count(), 8)
    for lines in run_ranks(worker, world, H, T, 64, backend="nccl", timeout_s=600,
                           env={"CUDA_MODULE_LOADING": "EAGER"}):
        print("\n".join(lines))
