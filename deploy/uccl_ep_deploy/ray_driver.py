#!/usr/bin/env python3
"""uccl-ep's one-command Ray launch: a plan (from `uccl-ep launch ray`) runs on a Ray cluster.

    python THIS_FILE [--address HEAD:6379] [--plan plan.json] [--timeout S]   (default plan: plan.json beside it)

1. connect to the cluster at --address (or $RAY_ADDRESS); with neither, start a local one;
2. reserve one bundle per node ({GPU: G, CPU: C}) in a STRICT_SPREAD placement group, bounded wait;
3. place one actor per bundle; bundle 0's node is the head (its IP is MASTER_ADDR);
4. each actor starts the node's command (with NODE_RANK, MASTER_ADDR, MASTER_PORT, NNODES and the
   recipe's env) in its own process group and prints its output, which Ray streams to this driver;
5. the first node that fails, or the deadline, stops every node; the actors and the placement
   group are always removed, and a cluster this script started is shut down.

NOTES: this file needs only the standard library and `ray`, so it runs in whatever Python has Ray
(a Ray venv, a framework container), without uccl_ep installed. `uccl-ep launch ray` writes it
unchanged into a job directory beside the plan (plan.json) and runs it as a script, or submits the
directory through Ray's job API (ray_jobs.py): the actor class then lives in `__main__`, which Ray
ships by value to the workers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque

def evaluate(argv: list, values: dict) -> list[str]:
    """Plan tokens (text, or {var, times, plus} for node-only values) -> concrete argv."""
    out = []
    for token in argv:
        text = []
        for part in token:
            if isinstance(part, str):
                text.append(part)
            else:
                v = values[part["var"]]
                times, plus = part.get("times", 1), part.get("plus", 0)
                text.append(str(v) if (times, plus) == (1, 0) else str(int(v) * times + plus))
        out.append("".join(text))
    return out


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def any_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def start_group(argv: list[str], env: dict) -> subprocess.Popen:
    full = dict(os.environ)
    full.update(env)
    return subprocess.Popen(argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)


def pump(proc: subprocess.Popen, prefix: str, tail: deque) -> None:
    """Copy the process' output to ours, line by line, with a prefix; keep the last lines."""
    assert proc.stdout is not None
    for line in proc.stdout:
        tail.append(line)
        sys.stdout.write(f"{prefix}{line}")
        sys.stdout.flush()


def stop_group(proc: subprocess.Popen | None, grace_s: float = 10.0) -> None:
    """TERM the process group, wait up to grace_s, then KILL it."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class NodeProc:
    """One per node (placement-group bundle): runs that node's command."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.tail: deque = deque(maxlen=40)

    def where(self, port: int) -> tuple[str, int]:
        import ray
        ip = ray.util.get_node_ip_address()
        return ip, (port if port_is_free(port) else any_free_port())

    def run(self, argv: list[str], env: dict, prefix: str) -> tuple[int, str]:
        print(f"{prefix}$ {' '.join(argv)}", flush=True)
        self.proc = start_group(argv, env)
        pump(self.proc, prefix, self.tail)
        return self.proc.wait(), "".join(self.tail)

    def stop(self) -> bool:
        stop_group(self.proc)
        return True


def _say(msg: str) -> None:
    print(f"[uccl-ep ray] {msg}", flush=True)


def launch(plan: dict, address: str | None, timeout_s: float, placement_timeout_s: float) -> int:
    # Every node's lines, not "[repeated 2x]"; Ray reads this when it is imported.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError:
        _say("this launcher needs Ray: pip install 'ray[default]'")
        return 3
    ray.init(address=address, log_to_driver=True, logging_level="warning")
    nodes, gpus = plan["nodes"], plan["gpus_per_node"]
    cpus = plan.get("cpus_per_node") or 1
    bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    pg = placement_group([dict(bundle) for _ in range(nodes)], strategy="STRICT_SPREAD" if nodes > 1 else "PACK")
    actors: list = []
    try:
        ready, _ = ray.wait([pg.ready()], timeout=placement_timeout_s)
        if not ready:
            _say(f"no room for {nodes} node(s) x {bundle} within {placement_timeout_s:.0f}s; "
                 f"cluster has {ray.cluster_resources()}")
            return 3
        # NOTES: max_concurrency=2 lets stop() run while run() blocks on the node's process.
        cls = ray.remote(NodeProc)
        actors = [cls.options(num_cpus=cpus, num_gpus=gpus, max_concurrency=2,
                              scheduling_strategy=PlacementGroupSchedulingStrategy(
                                  placement_group=pg, placement_group_bundle_index=i)).remote()
                  for i in range(nodes)]
        head_ip, port = ray.get(actors[0].where.remote(plan["master_port"]), timeout=120)
        ips = [head_ip] + [ray.get(a.where.remote(0), timeout=120)[0] for a in actors[1:]]
        _say(f"{nodes} node(s) {ips}; head {head_ip}:{port}")
        runs = {}
        for rank, actor in enumerate(actors):
            values = {"node_rank": rank, "master_addr": head_ip, "master_port": port}
            argv = evaluate(plan["head_argv"] if rank == 0 else plan["worker_argv"], values)
            env = dict(plan["env"], NODE_RANK=str(rank), NNODES=str(nodes), MASTER_ADDR=head_ip,
                       MASTER_PORT=str(port))
            runs[actor.run.remote(argv, env, f"[node {rank}] ")] = rank
        deadline = time.monotonic() + timeout_s
        pending = list(runs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                _say(f"timed out after {timeout_s:.0f}s; stopping every node")
                return 124
            rank = runs[done[0]]
            try:
                rc, tail = ray.get(done[0])
            except Exception as e:  # noqa: BLE001 - an actor died: report and stop the rest
                _say(f"node {rank} failed: {e}")
                return 1
            if rc != 0:
                _say(f"node {rank} exited with {rc}; stopping every node. Its last lines:\n{tail}")
                return rc
            _say(f"node {rank} finished")
        _say("all nodes finished")
        return 0
    finally:
        for a in actors:
            try:
                ray.get(a.stop.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - best effort; ray.kill below is the backstop
                pass
            ray.kill(a)
        remove_placement_group(pg)
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                    help="Ray cluster (HEAD:PORT); default $RAY_ADDRESS, else start a local cluster")
    ap.add_argument("--plan", help="plan JSON file (default: plan.json beside this file)")
    ap.add_argument("--timeout", type=float, default=0, help="seconds for the whole job (default: the plan's)")
    ap.add_argument("--placement-timeout", type=float, default=300, help="seconds to wait for the node slots")
    a = ap.parse_args(argv)
    # SIGTERM (scancel, the CLI's outer bound) takes the same teardown path as a failure.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    path = a.plan or os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan.json")
    if not os.path.isfile(path):
        ap.error(f"no plan at {path}: pass --plan, or write a job directory with `uccl-ep launch ray RECIPE -o DIR`")
    with open(path) as f:
        plan = json.load(f)
    return launch(plan, a.address, a.timeout or plan["timeout_s"], a.placement_timeout)


def _pump_thread(proc: subprocess.Popen, prefix: str, tail: deque) -> threading.Thread:
    t = threading.Thread(target=pump, args=(proc, prefix, tail), daemon=True)
    t.start()
    return t


if __name__ == "__main__":
    sys.exit(main())
