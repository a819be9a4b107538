"""Drives the native cases through worker subprocesses (crash and hang detection)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

CASE_BOUND_S = 30.0  # a native case that takes longer is a hang (every wait in a case is <= 5 s)
STARTUP_S = 120.0    # a worker's imports before its first case


def run_native(names: list[str], module: str = "hostile.native_cases",
               bound_s: float = CASE_BOUND_S) -> list[tuple[str, str, str]]:
    """(name, outcome, detail) per case of ``module.cases()``, in order, run by worker subprocesses
    (``module.NativeCtx()`` is their context); a worker restarts after a crash or a hang."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # core/tests/cpu
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    results: list[tuple[str, str, str]] = []
    start = 0
    while start < len(names):
        proc = subprocess.Popen([sys.executable, "-m", "hostile.native_worker", module, str(start)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=here)
        current = start
        began = time.monotonic() + STARTUP_S  # importing torch and uccl_ep is not the case's time
        pending = b""
        try:
            while True:
                ready, _, _ = select.select([proc.stdout], [], [], 1.0)
                if ready:
                    # NOTES: raw reads, not readline(): a buffered reader may hold a line that
                    # select() no longer reports as readable.
                    chunk = os.read(proc.stdout.fileno(), 1 << 16)
                    if not chunk:  # the worker is gone
                        proc.wait(timeout=10)
                        if current < len(names) and len(results) == current:
                            err = proc.stderr.read().decode(errors="replace")[-300:]
                            results.append((names[current], "crash", f"exit {proc.returncode}: {err}"))
                            current += 1
                        break
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        msg = json.loads(line)
                        if msg.get("begin"):
                            current, began = msg["i"], time.monotonic()
                            continue
                        results.append((names[msg["i"]], msg["outcome"], msg["detail"]))
                        current = msg["i"] + 1
                elif time.monotonic() - began > bound_s:
                    proc.kill()
                    proc.wait(timeout=10)
                    results.append((names[current], "hang", f"no result after {bound_s} s"))
                    current += 1
                    break
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        start = current
    return results


# --------------------------------------------------------------------------------------------------
# Buffer cases on 2 ranks
# --------------------------------------------------------------------------------------------------
def _rank_entry(rank: int, world: int, port: int, backend: str, start: int, queue) -> None:
    import datetime

    import torch.distributed as dist

    from . import classify
    from .buffer_cases import BufferCtx, cases
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    store = dist.distributed_c10d._get_default_store()
    all_cases = cases(backend)
    ctx = BufferCtx(backend, rank, world)
    for i in range(start, len(all_cases)):
        case = all_cases[i]
        queue.put(("begin", rank, i))
        outcome, detail = classify(case, ctx)
        queue.put(("done", rank, i, outcome, detail))
        # NOTES: the ranks meet after every case (through the store, bounded), so a case one rank
        # finished early never overlaps the next one on the other rank.
        store.set(f"hostile/{backend}/{start}/{i}/{rank}", b"1")
        peer_key = f"hostile/{backend}/{start}/{i}/{1 - rank}"
        deadline = time.monotonic() + 4 * 2.5 * 3.0
        while case.dies != 1 - rank and not _seen(store, peer_key) and time.monotonic() < deadline:
            time.sleep(0.01)
        if case.dies == 1 - rank:
            break  # the peer is gone: the rest of this backend's cases restart on fresh ranks
    queue.put(("end", rank))
    # rank 0 hosts the store: it leaves last (bounded), so rank 1's last look at it succeeds
    store.set(f"hostile/{backend}/{start}/end/{rank}", b"1")
    deadline = time.monotonic() + 10.0
    while rank == 0 and not _seen(store, f"hostile/{backend}/{start}/end/1") and time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(0)  # no teardown collectives with a peer that may be gone


def _seen(store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:  # noqa: BLE001 - the store's host (rank 0) is gone
        return False


def run_buffer(backend: str, bound_s: float = 60.0) -> list[tuple[str, str, str]]:
    """(name, outcome, detail) per Buffer case of ``backend`` on 2 spawned ranks. A case whose
    judge rank dies unexpectedly is a crash; one with no progress within ``bound_s`` is a hang;
    the ranks restart after either (and after a case that kills a rank on purpose)."""
    import multiprocessing as mp

    from uccl_ep.spawn import free_port

    from .buffer_cases import cases
    all_cases = cases(backend)
    worst = {"crash": 5, "hang": 4, "untyped": 3, "silent": 2, "typed": 1}
    results: list[tuple[str, str, str]] = []
    start = 0
    ctx = mp.get_context("spawn")
    while start < len(all_cases):
        q = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=_rank_entry, args=(r, 2, port, backend, start, q), daemon=True) for r in range(2)]
        for p in procs:
            p.start()
        got: dict[int, dict[int, tuple[str, str]]] = {}
        current, progress = start, time.monotonic()
        ended: set[int] = set()
        try:
            while len(ended) < 2:
                try:
                    msg = q.get(timeout=0.5)
                except Exception:  # noqa: BLE001 - queue.Empty
                    msg = None
                if msg is not None:
                    progress = time.monotonic()
                    if msg[0] == "begin":
                        current = max(current, msg[2])
                    elif msg[0] == "done":
                        got.setdefault(msg[2], {})[msg[1]] = (msg[3], msg[4])
                    else:
                        ended.add(msg[1])
                    continue
                case = all_cases[current]
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in ended]
                judged_dead = [r for r in dead if r in case.judges]
                if judged_dead:
                    have = got.get(current, {})
                    for r in judged_dead:
                        if r not in have:
                            have[r] = ("crash", f"rank {r} died (exit code {procs[r].exitcode})")
                    got[current] = have
                    break
                if dead and all(r not in case.judges for r in dead) and set(case.judges) <= set(got.get(current, {})):
                    break  # the expected death: the judges reported
                if time.monotonic() - progress > bound_s:
                    have = got.setdefault(current, {})
                    for r in case.judges:
                        have.setdefault(r, ("hang", f"rank {r}: no progress for {bound_s} s"))
                    break
        finally:
            for p in procs:
                p.join(timeout=1.0)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
        last = max(got) if got else start
        for i in range(start, last + 1):
            case = all_cases[i]
            per_rank = got.get(i, {})
            outs = [per_rank.get(r, ("crash", f"rank {r} never ran it")) for r in case.judges]
            outcome, detail = max(outs, key=lambda od: worst[od[0]])
            results.append((f"{backend}: {case.name}", outcome, detail))
        start = last + 1
    return results
