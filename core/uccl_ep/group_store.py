"""Bounded exchanges between the ranks of a process group, over the group's torch.distributed Store.

A gloo or NCCL collective waits as long as the process group's timeout (30 minutes by default)
and, when a peer is missing, cannot say which one. Here every message is a Store key, so every
wait is bounded by the caller's timeout and ends in an error that names the peer:

- `Timeout(rank, peer, phase)` when the peer is alive but did not send in time (it stalled, or
  stopped calling);
- `PeerFailure(rank, peer, phase)` when the peer's heartbeat stopped (its process died): every
  `GroupStore` keeps a heartbeat counter of its rank in the Store, raised by a daemon thread.

A peer may be skipped (``skip``, the masked ranks of shrink mode); ``on_missing`` lets a caller
turn a missing peer into a skipped one instead of an error (shrink: mask it and go on). Ranks
publish the set of peers they skip (``publish_skips``), so a rank another rank has cut off learns it
while waiting, as in DeepEP where the cut-off rank times out and masks the other in turn.

Keys: ``<prefix>/m/<op>/<src>/<dst>`` for the message of exchange number ``op`` (every rank counts
its exchanges; all ranks of the group make the same sequence of calls, as with collectives); the
receiver deletes a key once read, so the Store holds only messages in flight. A message over
``_PART_BYTES`` travels in parts (``<key>/<i>``, set before the key itself, which carries the
count). Slow (a Store round
trip per message) and exact; used by the reference backend, Buffer construction and the CUDA
executor's host barriers, where a bounded, named wait matters more than speed.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable, Optional, Sequence

import torch.distributed as dist

from .errors import PeerFailure, Timeout, UcclEpError

__all__ = ["GroupStore", "store_of", "heartbeat_interval_s", "failure_grace_s", "exchange_hostnames"]

_lock = threading.Lock()
_instances: dict[tuple, int] = {}

# NOTES: torch's libuv TCPStore server drops a client whose value exceeds 8 MiB ("Invalid payload
# size"), which a DeepSeek-size reference exchange at 4 ranks reaches; half of that leaves room.
_PART_BYTES = 4 << 20
# What a torch Store client raises once its server is gone (DistNetworkError, DistStoreError); an
# error of anything else inside an exchange (a bug, an on_missing callback) is not a lost Store.
_StoreLost = getattr(dist, "DistError", RuntimeError)
_NONE, _WHOLE, _PARTS = b"\x00", b"\x01", b"\x02"


def store_of(group):
    """The Store of ``group`` (its own prefix), or the default Store on old torch."""
    from torch.distributed import distributed_c10d as c10d
    try:
        return c10d._get_process_group_store(group)
    except Exception:  # noqa: BLE001 - older torch: the default store (keys carry the group's name)
        return c10d._get_default_store()


def _raw_store(store):
    """The Store under any PrefixStore wrappers."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def _own_client(raw, timeout_s: float):
    """A second connection to the TCPStore ``raw`` (None for other kinds of Store).

    NOTES: the heartbeat must not queue behind this process's other users of the Store: a
    blocking ``store.wait`` holds the client's lock for as long as it waits, and a rank whose
    heartbeat stalls would be reported dead instead of stalled."""
    if not isinstance(raw, dist.TCPStore):
        return None
    import datetime
    try:
        return dist.TCPStore(raw.host, raw.port, is_master=False, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=max(timeout_s, 1.0)))
    except Exception:  # noqa: BLE001 - e.g. a server bound to an address we cannot reach twice
        return None


def _group_key(group) -> str:
    name = getattr(group, "group_name", None)
    if not name:
        try:
            from torch.distributed import distributed_c10d as c10d
            name = c10d._get_process_group_name(group)
        except Exception:  # noqa: BLE001
            name = str(id(group))
    return str(name)


def heartbeat_interval_s(timeout_s: float) -> float:
    return min(max(timeout_s / 20.0, 0.02), 0.5)


def failure_grace_s(timeout_s: float) -> float:
    """Silence of a peer's heartbeat after which it is declared dead.

    NOTES: at most half the timeout (so a dead peer is reported as PeerFailure within it, not as a
    Timeout) and at least 10 heartbeats (a loaded machine may delay a few)."""
    return max(10 * heartbeat_interval_s(timeout_s), min(timeout_s * 0.5, 10.0))


def _beat(store, key: str, interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        try:
            store.add(key, 1)
        except Exception:  # noqa: BLE001 - the Store's server is gone: nothing left to tell
            return


class GroupStore:
    """Point-to-point messages between the ranks of ``group`` with bounded, named waits.

    ``name`` separates users of one group (every rank must create its instances of one name in
    the same order). ``timeout_s`` bounds each exchange as a whole.
    """

    def __init__(self, group, timeout_s: float, name: str) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.timeout_s = float(timeout_s)
        # Keys go to the Store under the group's wrappers, named by the group: the heartbeat's own
        # connection (_own_client) reaches only the underlying Store.
        self.store = _raw_store(store_of(group))
        key = (_group_key(group), name)
        with _lock:
            n = _instances.get(key, 0)
            _instances[key] = n + 1
        self.prefix = f"uccl_ep/{key[0]}/{name}/{n}"
        self.op = 0
        self._hb_seen = [(-1, 0.0)] * self.size   # per peer: (heartbeat value, when it last changed)
        self._skipped_by: set[int] = set()
        self._stop = threading.Event()
        self._hb_key = f"{self.prefix}/hb/{self.rank}"
        self.store.add(self._hb_key, 1)
        beat_store = _own_client(self.store, self.timeout_s) or self.store
        self._thread = threading.Thread(target=_beat, name=f"uccl_ep-heartbeat-{name}",
                                        args=(beat_store, self._hb_key,
                                              heartbeat_interval_s(self.timeout_s), self._stop), daemon=True)
        self._thread.start()
        self.publish_skips(())

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the heartbeat (peers then see this rank as gone) and join its thread."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._thread = None
        for key in (f"{self.prefix}/skip/{self.rank}",):
            try:
                self.store.delete_key(key)
            except Exception:  # noqa: BLE001 - the Store may be gone already
                pass

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self._stop.set()
        except Exception:  # noqa: BLE001
            pass

    # -- who skips whom ----------------------------------------------------------------------------
    def publish_skips(self, skip: Iterable[int]) -> None:
        """Tell every peer which ranks this rank neither sends to nor waits for."""
        bits = sum(1 << int(r) for r in set(skip))
        self.store.set(f"{self.prefix}/skip/{self.rank}", str(bits))

    def skips_me(self, peer: int) -> bool:
        """Whether ``peer`` has published that it skips this rank."""
        key = f"{self.prefix}/skip/{peer}"
        if not self.store.check([key]):
            return False
        return (int(self.store.get(key).decode() or "0") >> self.rank) & 1 == 1

    # -- liveness ----------------------------------------------------------------------------------
    def _dead(self, peer: int, now: float) -> bool:
        value = int(self.store.add(f"{self.prefix}/hb/{peer}", 0))
        if value == 0:  # the peer has not made its side yet (not dead: late)
            return False
        last, since = self._hb_seen[peer]
        if value != last:
            self._hb_seen[peer] = (value, now)
            return False
        return now - since > failure_grace_s(self.timeout_s)

    # -- messages ----------------------------------------------------------------------------------
    def _key(self, op: int, src: int, dst: int) -> str:
        return f"{self.prefix}/m/{op}/{src}/{dst}"

    def _send(self, key: str, payload: Optional[bytes]) -> None:
        if payload is None:
            self.store.set(key, _NONE)
        elif len(payload) <= _PART_BYTES:
            self.store.set(key, _WHOLE + payload)
        else:  # the parts first: the key's presence tells the receiver that all of them are there
            parts = range(0, len(payload), _PART_BYTES)
            for i, at in enumerate(parts):
                self.store.set(f"{key}/{i}", payload[at:at + _PART_BYTES])
            self.store.set(key, _PARTS + str(len(parts)).encode())

    def _receive(self, key: str) -> Optional[bytes]:
        data = self.store.get(key)
        self.store.delete_key(key)
        if data[:1] == _WHOLE:
            return data[1:]
        if data[:1] != _PARTS:
            return None
        chunks = []
        for i in range(int(data[1:].decode())):
            chunks.append(self.store.get(f"{key}/{i}"))
            self.store.delete_key(f"{key}/{i}")
        return b"".join(chunks)

    def exchange(self, per_dest: Sequence[Optional[bytes]], phase: str, skip: Iterable[int] = (),
                 on_missing: Optional[Callable[[int, BaseException], bool]] = None,
                 learn_skips: bool = False) -> list[Optional[bytes]]:
        """Send ``per_dest[r]`` to rank r (None: send nothing) and return what each rank sent this
        rank in this exchange (None for skipped ranks and for ranks that sent None).

        Ranks in ``skip`` get nothing and are not waited for. A peer that does not send within the
        timeout raises `Timeout`, one whose heartbeat stopped `PeerFailure`; with ``on_missing``,
        ``on_missing(peer, error)`` returning True skips the peer instead. With ``learn_skips`` a
        peer that published that it skips this rank is skipped too (and reported by
        ``skipped_by()``). A Store that stops answering (its host process exited) raises
        `PeerFailure` naming the phase, not the Store client's own error.
        """
        try:
            return self._exchange(per_dest, phase, skip, on_missing, learn_skips)
        except UcclEpError:
            raise
        except (_StoreLost, OSError) as e:  # torch's DistNetworkError / DistStoreError, or a socket error
            detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise PeerFailure(self.rank, None, phase, f"the process group's Store stopped answering "
                              f"({type(e).__name__}: {detail[:200]}); the process that hosts it (rank 0 for "
                              "init_process_group's TCPStore, else the launcher's agent) has probably "
                              "exited") from e

    def _exchange(self, per_dest, phase, skip, on_missing, learn_skips) -> list[Optional[bytes]]:
        """exchange() without the Store-loss translation."""
        op = self.op
        self.op += 1
        skip = set(skip)
        self._skipped_by = set()
        out: list[Optional[bytes]] = [None] * self.size
        for dst in range(self.size):
            if dst in skip:
                continue
            payload = per_dest[dst]
            if dst == self.rank:
                out[dst] = payload
            else:
                self._send(self._key(op, self.rank, dst), payload)
        waiting = [src for src in range(self.size) if src != self.rank and src not in skip]
        started = time.monotonic()
        deadline = started + self.timeout_s
        pause, next_slow = 5e-5, started + 0.05
        while waiting:
            still = []
            for src in waiting:
                key = self._key(op, src, self.rank)
                if self.store.check([key]):
                    out[src] = self._receive(key)
                else:
                    still.append(src)
            waiting = still
            if not waiting:
                break
            now = time.monotonic()
            if now >= next_slow or now >= deadline:  # the slow checks: skips, liveness, timeout
                next_slow = now + 0.05
                for src in list(waiting):
                    error: Optional[BaseException] = None
                    if learn_skips and self.skips_me(src):
                        self._skipped_by.add(src)
                        waiting.remove(src)
                        continue
                    if self._dead(src, now):
                        error = PeerFailure(self.rank, src, phase, "its heartbeat in the process group's Store "
                                            f"stopped {failure_grace_s(self.timeout_s):.1f}s ago (the process died)")
                    elif now >= deadline:
                        error = Timeout(self.rank, src, phase, now - started,
                                        outstanding=f"ranks {waiting} have not sent their part of exchange {op}",
                                        hint="the peer stalled or stopped calling")
                    if error is None:
                        continue
                    if on_missing is not None and on_missing(src, error):
                        waiting.remove(src)
                        try:  # a late message (and its parts) must not stay in the Store
                            key = self._key(op, src, self.rank)
                            if self.store.check([key]):
                                self._receive(key)
                        except Exception:  # noqa: BLE001
                            pass
                        continue
                    raise error
                if not waiting:
                    break
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        return out

    def skipped_by(self) -> set[int]:
        """Peers the last exchange (with ``learn_skips``) found skipping this rank."""
        return set(self._skipped_by)

    def all_gather(self, payload: bytes, phase: str, skip: Iterable[int] = (),
                   on_missing: Optional[Callable[[int, BaseException], bool]] = None) -> list[Optional[bytes]]:
        """Every rank's ``payload`` (None for skipped ranks)."""
        return self.exchange([payload] * self.size, phase, skip=skip, on_missing=on_missing)

    def barrier(self, phase: str, skip: Iterable[int] = (),
                on_missing: Optional[Callable[[int, BaseException], bool]] = None, learn_skips: bool = False) -> None:
        self.exchange([b""] * self.size, phase, skip=skip, on_missing=on_missing, learn_skips=learn_skips)


def exchange_hostnames(group, timeout_s: float) -> list[str]:
    """Every rank's host name, in rank order (Buffer construction), within ``timeout_s``: a rank
    that does not construct its Buffer in time raises `Timeout` naming it on the others."""
    from .topology import local_hostname
    channel = GroupStore(group, timeout_s, "hostnames")
    try:
        return [b.decode() for b in channel.all_gather(local_hostname().encode(), "Buffer() (host names)")]
    finally:
        channel.close()
