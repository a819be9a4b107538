"""`uccl-ep bench transport`: write-with-immediate rate and bandwidth between two local ranks.

Rank 0's host threads push counted writes of S bytes into its proxy's FIFOs (one producer per
FIFO), ending every FIFO's stream with a fenced atomic; rank 1 waits until every fence fired,
i.e. every byte landed and every immediate was counted. Time = rank 1's wait from a common start
(a gloo barrier). writes/s = N / time; GB/s = N * S / 1e9 / time. Providers: the `loop`
transport (shared memory) and each libfabric provider given (`tcp;ofi_rxm` here; `efa`,
`verbs;ofi_rxm` on RDMA hosts). Needs no GPU; skips libfabric when it is absent.
"""

from __future__ import annotations

import time

__all__ = ["add_arguments", "run", "measure_pair"]


def add_arguments(parser) -> None:
    g = parser.add_argument_group("bench transport")
    g.add_argument("--transports", default="loop,fabric:tcp;ofi_rxm",
                   help="comma list of `loop`, `fabric:<provider>` (default: loop,fabric:tcp;ofi_rxm)")
    g.add_argument("--sizes", default="7168,32768", help="write sizes in bytes (multiples of 16)")
    g.add_argument("--writes", type=int, default=20000, help="writes per size")
    g.add_argument("--transport-threads", type=int, default=2, help="proxy threads per rank")


def _worker(rank, world, cases, sizes, writes, threads):
    import torch.distributed as dist

    from ..proxy import start_proxy
    out = []
    slots = 16
    for transport, provider in cases:
        region = 2 * slots * max(sizes) + 4096
        p = start_proxy(dist.group.WORLD, region_bytes=region, num_counters=16, transport=transport,
                        provider=provider, num_threads=threads, fifos_per_thread=1, timeout_s=120.0)
        try:
            name = p.transport_name
            for size in sizes:
                per_fifo = writes // p.num_fifos
                base = [int(p.counter(0, f)) for f in range(p.num_fifos)] if rank == 1 else []
                dist.barrier()
                t0 = time.perf_counter()
                if rank == 0:
                    n, _ = p.run_load(p.num_fifos, per_fifo, dst=1, write_bytes=size, src_off=0,
                                      dst_off=slots * max(sizes), slots=slots, fence=True, timeout_s=120.0)
                    out.append((name, size, n))
                else:
                    for f in range(p.num_fifos):
                        p.wait_counter(0, f, base[f] + per_fifo + 1, 120.0, "bench transport")
                    out.append((name, size, per_fifo * p.num_fifos, time.perf_counter() - t0))
                dist.barrier()
        finally:
            p.stop()
    return out


def measure_pair(cases, sizes, writes, threads, timeout_s=900.0):
    from ..spawn import run_ranks
    rank0, rank1 = run_ranks(_worker, 2, cases, sizes, writes, threads, timeout_s=timeout_s)
    return [dict(transport=name, size=size, writes=n, seconds=s, rate=n / s, gbps=n * size / s / 1e9)
            for name, size, n, s in rank1]


def run(args) -> int:
    from rich.table import Table

    from ..proxy import transport_unavailable_reason
    from .fifo import emit
    cases, skipped = [], []
    for item in [t.strip() for t in args.transports.split(",") if t.strip()]:
        name, _, provider = item.partition(":")
        reason = transport_unavailable_reason(name)
        if reason:
            skipped.append(f"{item}: {reason}")
        else:
            cases.append((name, provider or None))
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = measure_pair(cases, sizes, args.writes, args.transport_threads) if cases else []
    table = Table(title=f"uccl-ep bench transport: 2 local ranks, {args.transport_threads} proxy threads each, "
                        f"{args.writes} writes per size, one direction")
    for col in ("transport", "bytes", "writes", "time ms", "writes/s", "GB/s"):
        table.add_column(col, justify="right" if col != "transport" else "left")
    for r in rows:
        table.add_row(r["transport"], str(r["size"]), str(r["writes"]), f"{r['seconds'] * 1e3:.1f}",
                      f"{r['rate']:,.0f}", f"{r['gbps']:.2f}")
    emit(table, args, {"rows": rows, "skipped": skipped}, [f"skipped {s}" for s in skipped])
    return 0
