"""Liveness of the peers on this host, for the cuda executor's NVLink paths.

A kernel that waits on a peer over NVLink only sees the peer's flags stop moving: a dead peer and
a slow one look the same until the wait's timeout, which then names it in a `Timeout`. The proxy
paths know better (the proxy's heartbeats, `PeerFailure`); this gives the NVLink paths the same:
every rank publishes at set-up who its process is (boot id, pid, start time in /proc), and a
daemon thread ("uccl_ep-peerwatch") looks at the processes of the peers on this host a few times
per second. When one has exited (its /proc entry is gone, a zombie, or a new process under the
pid), the thread records a PeerFailure in the executor's error word: the kernels' bounded waits
check that word and end at once, and the host raises PeerFailure naming the peer (NCCL's
cooperative abort, with the device's own error word as the abort flag).

A peer whose process this rank cannot see (another host, another PID namespace) is not watched:
its waits end in the kernels' Timeout as before. Shrink mode does not use this (a failed peer is
masked there, not fatal).
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Optional

__all__ = ["process_record", "process_gone", "PeerWatch"]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _stat(pid: int) -> Optional[tuple[str, int]]:
    """(state, start time in clock ticks since boot) of process `pid`, or None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    # the command name is in parentheses and may hold spaces: the fields start after the last ')'
    fields = data[data.rfind(")") + 2:].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def process_record() -> tuple[str, int, int]:
    """(boot id, pid, start time) of this process: what a peer on this host needs to watch it."""
    st = _stat(os.getpid())
    return _boot_id(), os.getpid(), st[1] if st else -1


def process_gone(record) -> Optional[str]:
    """Why the process of `record` (process_record() of a peer on this host) no longer runs, or None."""
    _, pid, start = record
    st = _stat(pid)
    if st is None:
        return f"its process (pid {pid}) exited"
    state, now_start = st
    if now_start != start:
        return f"its process (pid {pid}) exited (the pid now belongs to another process)"
    if state in ("Z", "X", "x"):
        return f"its process (pid {pid}) exited (state {state})"
    return None


def watchable(record) -> bool:
    """Whether this process sees the process of `record` as it was published (same host and boot,
    same PID namespace, running)."""
    if not record or record[0] == "" or record[0] != _boot_id() or record[2] < 0:
        return False
    return process_gone(record) is None


class PeerWatch:
    """Calls ``on_gone(peer, why)`` once for the first peer (of ``records``, index = rank) whose
    process exited, from a daemon thread that looks every ``interval_s``; peers this process cannot
    see are left out. ``close()`` stops and joins the thread (bounded)."""

    def __init__(self, rank: int, records: list, on_gone: Callable[[int, str], None], interval_s: float) -> None:
        self.rank = rank
        self.peers = {r: rec for r, rec in enumerate(records) if r != rank and watchable(rec)}
        self._on_gone = on_gone
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if self.peers:
            self._thread = threading.Thread(target=self._run, name="uccl_ep-peerwatch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            for peer, rec in self.peers.items():
                why = process_gone(rec)
                if why is not None:
                    self._on_gone(peer, why)
                    return  # the first failure is the one the buffer reports

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
