"""Normal-mode dispatch + combine over a grid of (tokens, hidden, experts, top-k, weights, configs) with a
short device timeout: which shapes the copy-engine combine finishes (not a test).

python tools/lab/diag_ce_combine.py   (every GPU; UCCL_EP_GPU_TIMEOUT_S defaults to 3 here)
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "core", "tests"))  # multirank
from multirank import run_ranks  # noqa: E402

GRID = [(T, H, E, K, w, cfg) for T, H, E in ((64, 2048, 16), (512, 2048, 64)) for K in (4, 8)
        for w in (True, False) for cfg in ("same", "none")]


def worker(rank, world):
    from uccl_ep import Buffer
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    out = []
    buf = None
    for T, H, E, K, with_w, cfg in GRID:
        if buf is None:
            nvl = Buffer.get_dispatch_config(world).get_nvl_buffer_size_hint(7168 * 2, world)
            buf = Buffer(dist.group.WORLD, nvl, 0, backend="cuda", explicitly_destroy=True)
        g = torch.Generator().manual_seed(rank * 7 + T + K)
        x = torch.randn(T, H, generator=g).bfloat16().to(dev)
        idx = torch.rand(T, E, generator=g).topk(K, dim=1).indices.to(dev)
        w = torch.rand(T, K, generator=g).to(dev)
        kw = dict(config=Buffer.get_dispatch_config(world)) if cfg == "same" else {}
        tag = f"T{T} H{H} E{E} K{K} w={int(with_w)} cfg={cfg}"
        try:
            a, _, c, d, _ = buf.get_dispatch_layout(idx, E)
            rx, _, rw, _, h, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w if with_w else None,
                                              num_tokens_per_rank=a, is_token_in_rank=d, num_tokens_per_expert=c, **kw)
            comb, _, _ = buf.combine(rx, h, topk_weights=rw if with_w else None, **kw)
            torch.cuda.synchronize()
            buf._executor.check_error()
            ok = torch.allclose(comb.float(), (x.float() * d.sum(1, keepdim=True).float()).bfloat16().float(),
                                rtol=1e-2, atol=1e-2)
            out.append(f"{tag}: {'ok' if ok else 'WRONG'} ce={getattr(h.plan, 'ce', None)}")
        except Exception as e:  # noqa: BLE001
            out.append(f"{tag}: {type(e).__name__}: {str(e)[:160]}")
            try:
                buf.destroy()
            except Exception:  # noqa: BLE001
                pass
            buf = None
        dist.barrier()
    return out


if __name__ == "__main__":
    os.environ.setdefault("UCCL_EP_GPU_TIMEOUT_S", "3")
    os.environ.setdefault("UCCL_EP_TIMEOUT_S", "20")
    res = run_ranks(worker, min(torch.cuda.device_count(), 8), backend="gloo", timeout_s=400)
    for r, lines in enumerate(res):
        for line in lines:
            print(f"rank {r} {line}")
