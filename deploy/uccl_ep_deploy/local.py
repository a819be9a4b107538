"""Run a plan on this host: every "node" of the plan as its own process group, head at 127.0.0.1.

Useful for a one-node recipe on a workstation, and to try a multi-node recipe's wiring (node
ranks, rendezvous, env) on one machine. Output is streamed with a ``[node R]`` prefix; the first
node to fail, or the deadline, stops all of them.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

from .plan import Plan, evaluate_argv
from .ray_driver import _pump_thread, any_free_port, port_is_free, start_group, stop_group

__all__ = ["run_local", "local_commands"]


def local_commands(plan: Plan, master_addr: str, master_port: int) -> list[tuple[list[str], dict[str, str]]]:
    out = []
    for rank in range(plan.nodes):
        values = {"node_rank": rank, "master_addr": master_addr, "master_port": master_port}
        out.append((evaluate_argv(plan.node_argv(rank), values), plan.node_env(rank, master_addr, master_port)))
    return out


def run_local(plan: Plan, timeout_s: float, master_addr: str = "127.0.0.1",
              say: Callable[[str], None] = print) -> int:
    port = plan.master_port if port_is_free(plan.master_port) else any_free_port()
    if port != plan.master_port:
        say(f"[uccl-ep local] port {plan.master_port} is busy; using {port}")
    procs, threads, tails = [], [], []
    deadline = time.monotonic() + timeout_s
    try:
        for rank, (argv, env) in enumerate(local_commands(plan, master_addr, port)):
            say(f"[node {rank}] $ {' '.join(argv)}")
            tails.append(deque(maxlen=40))
            procs.append(start_group(argv, env))
            threads.append(_pump_thread(procs[-1], f"[node {rank}] ", tails[-1]))
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                say(f"[uccl-ep local] node {rank} exited with {code}; stopping the others")
                return code
            if all(c == 0 for c in codes):
                say(f"[uccl-ep local] all {plan.nodes} node(s) finished")
                return 0
            if time.monotonic() > deadline:
                say(f"[uccl-ep local] timed out after {timeout_s:.0f}s; stopping every node")
                return 124
            time.sleep(0.2)
    finally:
        for p in procs:
            stop_group(p)
        for t in threads:
            t.join(timeout=5)
