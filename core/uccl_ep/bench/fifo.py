"""`uccl-ep bench fifo`: command-queue throughput.

Two measurements per (proxy threads, producer threads):
- queue: producers push 16-byte TransferCmds into one FIFO, one consumer thread pops and checks
  them (the bare ring: reservation, lap-parity commit, tail, no proxy work);
- proxy: producers push Atomic commands into the FIFOs of a one-rank proxy whose threads post
  them over the `loop` transport to itself, the receiver applies them to counters, and the
  producers wait for completion: the whole GPU-to-counter path minus the GPU.
Mops/s = commands / seconds (first push to last completion). Needs no GPU, NIC or libfabric.
"""

from __future__ import annotations

import hashlib
import os
import secrets

__all__ = ["add_arguments", "run", "measure", "emit"]


def add_arguments(parser) -> None:
    g = parser.add_argument_group("bench fifo")
    g.add_argument("--fifo-producers", default="", help="producer thread counts, e.g. 1,2,4 (default: up to the CPUs)")
    g.add_argument("--fifo-threads", default="", help="proxy thread counts, e.g. 1,2,4 (default: 1,2,4 up to the CPUs)")
    g.add_argument("--fifo-commands", type=int, default=200_000, help="commands per producer")
    g.add_argument("--fifo-capacity", type=int, default=2048, help="slots per FIFO")


def _counts(text: str, default: list[int]) -> list[int]:
    if not text:
        return default
    return [int(x) for x in text.split(",") if x.strip()]


def _one_rank_proxy(C, threads: int, capacity: int):
    p = C.Proxy(dict(rank=0, num_ranks=1, num_threads=threads, fifos_per_thread=2, fifo_capacity=capacity,
                     num_counters=64, region_bytes=1 << 16, transport="loop", max_inflight=1024,
                     token_digest=hashlib.sha256(secrets.token_bytes(16)).hexdigest(), timeout_s=120.0))
    p.connect([p.local_info()])
    p.finalize_setup()
    p.start()
    return p


def measure(threads: int, producers: int, commands: int, capacity: int) -> dict:
    from ..proxy import native
    C = native()
    queue = C.fifo_stress(capacity, producers, commands, 120.0)
    if queue["corrupt"] or queue["out_of_order"] or queue["consumed"] != producers * commands:
        raise RuntimeError(f"fifo stress found errors: {queue}")
    p = _one_rank_proxy(C, threads, capacity)
    try:
        n, seconds = p.run_load(producers, commands, dst=0, timeout_s=120.0)
        counted = int(p.counters().sum())
    finally:
        p.stop()
    if counted != n:
        raise RuntimeError(f"proxy applied {counted} of {n} atomics")
    return dict(threads=threads, producers=producers, commands=n, queue_mops=queue["consumed"] / queue["seconds"] / 1e6,
                proxy_mops=n / seconds / 1e6)


def run(args) -> int:
    from rich.table import Table
    cpus = os.cpu_count() or 2
    producers = _counts(args.fifo_producers, [n for n in (1, 2, 4, 8, 16) if n <= max(cpus, 2)])
    threads = _counts(args.fifo_threads, [n for n in (1, 2, 4) if n <= max(cpus, 1)] or [1])
    rows = [measure(t, p, args.fifo_commands, args.fifo_capacity) for t in threads for p in producers]
    table = Table(title=f"uccl-ep bench fifo: {cpus} CPUs, {args.fifo_commands} commands per producer, "
                        f"{args.fifo_capacity}-slot FIFOs, loop transport")
    for col in ("proxy threads", "producers", "commands", "queue Mops/s", "proxy+loop Mops/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["threads"]), str(r["producers"]), str(r["commands"]), f"{r['queue_mops']:.2f}",
                      f"{r['proxy_mops']:.2f}")
    emit(table, args, {"cpus": cpus, "rows": rows})
    return 0


def emit(table, args, payload: dict, notes: list[str] = ()) -> None:
    """Print a rich table (never truncated in logs) and, with --json, the rows as JSON."""
    import json

    from rich.console import Console
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(table)
    for note in notes:
        console.print(note)
    if getattr(args, "json", None):
        text = json.dumps(payload, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
