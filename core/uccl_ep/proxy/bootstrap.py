"""Bootstrap of the proxies of a process group over its torch.distributed Store.

Three rounds, each bounded by the timeout and naming the rank that is missing:
1. host names and a fresh random nonce per rank (to pick `loop` for one host, `fabric` across
   hosts when the transport is `auto`; the nonces are the challenges of step 2);
2. endpoint records (`Proxy.local_info()`: token digest, settings, per-thread addresses and
   region keys); every rank checks every record, so a rank with another job token is refused
   by all of them with `PeerProtocolError`. With a job secret configured (``token=`` or
   UCCL_EP_JOB_TOKEN) each record comes with a proof: HMAC-SHA256, keyed by the secret, over this
   bootstrap's nonces of every rank, the rank and its record. Every rank verifies every proof
   before it connects, so a store client without the secret can neither join nor substitute a
   rank's record, and an old proof does not verify against fresh nonces;
3. "connected" marks, after which shared-memory names are unlinked and the threads start.

What the default (no secret) protects: ranks of different sessions or jobs that share a store by
mistake never connect (the token is a random session string rank 0 writes into the store). It
authenticates nothing: any client of the store reads the session string. See
docs/troubleshooting.md ("Job token") for what a secret adds and what it does not.

A rank that fails during setup publishes its error under ``.../error/<rank>`` so the others
raise `PeerFailure` naming it at once instead of waiting for their timeout.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import threading
import time
from typing import Any

import torch.distributed as dist

from .. import env
from ..errors import InvalidArgument, PeerFailure, PeerProtocolError, Timeout, Unsupported
from .native import native
from .nic_model import decorate as decorate_with_nic_model, parse_nic_model
from .nics import domains_for_local_rank, resolve_domains  # noqa: F401 - domains_for_local_rank: re-exported

__all__ = ["native", "start_proxy", "token_digest", "transport_unavailable_reason", "parse_fault_spec", "numa_cpus"]

_lock = threading.Lock()
_sequence: dict[int, int] = {}


def token_digest(token: str) -> str:
    """Hex digest published in place of the job token (the token itself never leaves the rank)."""
    return hashlib.sha256(("uccl_ep-job-token:" + token).encode()).hexdigest()


def _proof(secret: str, prefix: str, rank: int, nonces: list[bytes], record: bytes) -> bytes:
    """HMAC-SHA256 of (prefix, rank, every rank's nonce, the record) keyed by the job secret."""
    msg = b"\0".join([b"uccl_ep-bootstrap-proof-v1", prefix.encode(), str(rank).encode(), *nonces,
                      hashlib.sha256(record).digest()])
    return hmac.new(hashlib.sha256(b"uccl_ep-job-secret:" + secret.encode()).digest(), msg, hashlib.sha256).digest()


def _check_proofs(secret: str, prefix: str, rank: int, nonces: list[bytes], records: list[bytes],
                  proofs: list[bytes]) -> None:
    """PeerProtocolError naming the first rank whose proof does not verify with our secret."""
    for r, (record, proof) in enumerate(zip(records, proofs)):
        if r != rank and not hmac.compare_digest(_proof(secret, prefix, r, nonces, record), proof):
            err = PeerProtocolError(f"rank {rank}: rank {r} presented a different job token: its proof (HMAC-SHA256 "
                                    "over this bootstrap's nonces and its endpoint record) does not verify with this "
                                    "rank's secret (another job, or UCCL_EP_JOB_TOKEN differs between ranks)")
            err.rank, err.peer, err.phase = rank, r, "bootstrap (job token)"
            raise err


def transport_unavailable_reason(name: str) -> str | None:
    """None when the transport can be created here, else why not."""
    reason = native().transport_unavailable_reason(name)
    return reason or None


def fabric_domains(provider: str | None = None) -> list[str]:
    """NICs (libfabric domain names) the `fabric` transport can open with ``provider`` (default:
    UCCL_EP_FABRIC_PROVIDER, else the one it would pick), in the provider's order: the names
    UCCL_EP_FABRIC_DOMAINS takes."""
    prov = env.get("UCCL_EP_FABRIC_PROVIDER") if provider is None else provider
    return list(native().fabric_domains(prov or ""))


def parse_fault_spec(spec: str | dict | None) -> dict[str, Any]:
    """``"reorder=1,delay=16,tear=0.3,pieces=4,seed=7"`` (or a dict) -> proxy fault options."""
    if spec is None or spec == "":
        return {}
    items = dict(spec) if isinstance(spec, dict) else {}
    if isinstance(spec, str):
        for part in spec.split(","):
            if "=" not in part:
                raise InvalidArgument("UCCL_EP_FAULT", "comma-separated key=value pairs", repr(spec))
            k, v = part.split("=", 1)
            items[k.strip()] = v.strip()
    names = {"reorder": ("fault_reorder", float), "delay": ("fault_max_delay", int), "tear": ("fault_tear", float),
             "pieces": ("fault_max_pieces", int), "seed": ("fault_seed", int)}
    out: dict[str, Any] = {}
    for k, v in items.items():
        if k not in names:
            raise InvalidArgument("UCCL_EP_FAULT", f"keys among {', '.join(names)}", repr(k))
        key, kind = names[k]
        try:
            out[key] = kind(v)
        except (TypeError, ValueError):
            raise InvalidArgument("UCCL_EP_FAULT", f"{k}=<{kind.__name__}>", repr(v)) from None
    if not 0.0 <= out.get("fault_reorder", 0.0) <= 1.0 or not 0.0 <= out.get("fault_tear", 0.0) <= 1.0:
        raise InvalidArgument("UCCL_EP_FAULT", "reorder and tear probabilities in [0, 1]", repr(spec))
    return out


def numa_cpus(node: int | None) -> str:
    """CPU list of NUMA node `node` ("" when unknown), for pinning proxy threads near a GPU/NIC."""
    if node is None or node < 0:
        return ""
    try:
        with open(f"/sys/devices/system/node/node{int(node)}/cpulist") as f:
            return f.read().strip()
    except OSError:
        return ""


def _store_of(group) -> Any:
    from torch.distributed import distributed_c10d as c10d
    try:
        return c10d._get_process_group_store(group)
    except Exception:  # noqa: BLE001 - older torch: the default store with our own prefix
        return c10d._get_default_store()


def _wait_all(store, prefix: str, what: str, rank: int, world: int, deadline: float, started: float,
              phase: str) -> list[bytes]:
    """Values of ``prefix/what/<r>`` for every rank; PeerFailure / Timeout name the missing rank."""
    missing = list(range(world))
    pause = 0.001
    while missing:
        still = []
        for r in missing:
            if store.check([f"{prefix}/{what}/{r}"]):
                continue
            # NOTES: the value is checked again after the error is seen: a peer may publish its value,
            # then fail a later phase between our two checks; the value it published is what this phase
            # waits for, and this rank's own later checks then name the failure from its side.
            if store.check([f"{prefix}/error/{r}"]) and not store.check([f"{prefix}/{what}/{r}"]):
                msg = store.get(f"{prefix}/error/{r}").decode(errors="replace")
                raise PeerFailure(rank, r, phase, f"its setup failed: {msg}")
            still.append(r)
        missing = still
        if not missing:
            break
        now = time.monotonic()
        if now >= deadline:
            raise Timeout(rank, missing[0], phase, now - started,
                          outstanding=f"ranks {missing} have not published '{what}'")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return [store.get(f"{prefix}/{what}/{r}") for r in range(world)]


def idle_sleep_ns() -> int:
    """Longest sleep of an idle proxy thread (UCCL_EP_PROXY_IDLE_SLEEP_US; -1 for `spin`; `auto`: never sleep on
    hosts with >= 16 CPUs -- GPU servers, where every hop would otherwise pay the timer slack --
    and 50 us on small machines, where spinning threads starve the ranks they wait for)."""
    value = str(env.get("UCCL_EP_PROXY_IDLE_SLEEP_US")).strip().lower()
    if value == "auto":
        return 0 if (os.cpu_count() or 1) >= 16 else 50_000
    if value == "spin":
        return -1
    try:
        us = float(value)
    except ValueError:
        raise InvalidArgument("UCCL_EP_PROXY_IDLE_SLEEP_US", "`auto`, `spin` or a number of microseconds >= 0", value) from None
    if us < 0:
        raise InvalidArgument("UCCL_EP_PROXY_IDLE_SLEEP_US", "`auto`, `spin` or a number of microseconds >= 0", value)
    return int(us * 1000)


def start_proxy(group, *, region_bytes: int, num_counters: int, transport: str | None = None,
                provider: str | None = None, num_threads: int | None = None, fifos_per_thread: int = 2,
                fifo_capacity: int = 2048, max_inflight: int | None = None, timeout_s: float | None = None,
                ranks_per_node: int | None = None, fault: str | dict | None = None, token: str | None = None,
                check_remote_bounds: bool = True, heartbeat_s: float = 0.0, cpus: str = "",
                numa_node: int | None = None, store=None, external_region: int = 0, ipc_copy: str = "",
                nic_model: str | None = None):
    """Create, bootstrap, connect and start this rank's proxy (collective over ``group``).

    Unset arguments come from the env registry (UCCL_EP_TRANSPORT, UCCL_EP_FABRIC_PROVIDER,
    UCCL_EP_NUM_PROXY_THREADS, UCCL_EP_MAX_INFLIGHT, UCCL_EP_TIMEOUT_S, UCCL_EP_JOB_TOKEN,
    UCCL_EP_FAULT, UCCL_EP_NIC_MODEL: a NIC's line rate, latency and reordering around the
    transport's traffic to other nodes, uccl_ep.proxy.nic_model). ``cpus`` (a CPU list) or
    ``numa_node`` pins the proxy threads (the GPU runtime passes its device's NUMA node).
    ``store`` replaces the group's Store (e.g. a TCPStore shared by the job); ``external_region``
    registers caller-owned memory of ``region_bytes`` instead of allocating it; ``ipc_copy="kernel"`` makes the ipc transport queue its copies in a
    descriptor ring for the caller's GPU copy kernel (``copy_rings()``). Returns the native ``uccl_ep._C.Proxy`` (call ``stop()`` when done).
    """
    C = native()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    timeout_s = float(env.get("UCCL_EP_TIMEOUT_S") if timeout_s is None else timeout_s)
    if timeout_s <= 0:
        raise InvalidArgument("timeout_s", "a positive number of seconds", timeout_s)
    ranks_per_node = ranks_per_node or world
    model = parse_nic_model(nic_model if nic_model is not None else env.get("UCCL_EP_NIC_MODEL"),
                            "nic_model" if nic_model is not None else "UCCL_EP_NIC_MODEL")
    store = store if store is not None else _store_of(group)
    with _lock:
        n = _sequence.get(id(group), 0)
        _sequence[id(group)] = n + 1
    prefix = f"uccl_ep/proxy/{n}"
    started = time.monotonic()
    deadline = started + timeout_s
    try:
        if rank == 0:
            store.set(f"{prefix}/session/0", secrets.token_hex(16))
        session = _wait_all(store, prefix, "session", rank, 1, deadline, started, "bootstrap (session)")[0].decode()
        secret = token if token is not None else (env.get("UCCL_EP_JOB_TOKEN") or None)
        if secret is not None and (not isinstance(secret, str) or not secret):
            raise InvalidArgument("token", "a non-empty str (the job secret)", repr(secret))
        # With a secret, the published digest is bound to this session (it names shared objects and
        # must agree between ranks) and gives a store reader nothing to replay; the proofs decide.
        token = session if secret is None else hmac.new(secret.encode(), b"uccl_ep-job-id:" + session.encode(),
                                                         hashlib.sha256).hexdigest()
        store.set(f"{prefix}/host/{rank}", socket.gethostname())
        mode = b"secret:" if secret is not None else b"session:"
        store.set(f"{prefix}/nonce/{rank}", mode + secrets.token_bytes(32))
        hosts = _wait_all(store, prefix, "host", rank, world, deadline, started, "bootstrap (host names)")
        nonces = _wait_all(store, prefix, "nonce", rank, world, deadline, started, "bootstrap (nonces)")
        for r, nonce in enumerate(nonces):
            if not nonce.startswith(mode):
                err = PeerProtocolError(f"rank {rank}: rank {r} presented a different job token: it "
                                        f"{'has no' if secret is not None else 'has a'} job secret "
                                        f"(token= / UCCL_EP_JOB_TOKEN) and this rank {'has' if secret else 'has none'}")
                err.rank, err.peer, err.phase = rank, r, "bootstrap (job token)"
                raise err

        name = transport or env.get("UCCL_EP_TRANSPORT")
        if name == "auto":
            name = "loop" if len(set(hosts)) == 1 else "fabric"
        base = name[len("fault:"):] if name.startswith("fault:") else name
        reason = transport_unavailable_reason(base)
        if reason:
            raise Unsupported(f"transport '{base}' is not available on this machine: {reason}")
        fault_opts = parse_fault_spec(fault if fault is not None else env.get("UCCL_EP_FAULT"))
        if fault_opts and not name.startswith("fault:"):
            name = "fault:" + name
        name = decorate_with_nic_model(name, model)
        config = dict(rank=rank, num_ranks=world, ranks_per_node=ranks_per_node,
                      num_threads=int(num_threads or env.get("UCCL_EP_NUM_PROXY_THREADS")),
                      fifos_per_thread=fifos_per_thread, fifo_capacity=fifo_capacity, num_counters=num_counters,
                      region_bytes=int(region_bytes), transport=name, ipc_copy=ipc_copy,
                      provider=provider if provider is not None else env.get("UCCL_EP_FABRIC_PROVIDER"),
                      token_digest=token_digest(token),
                      max_inflight=int(max_inflight or env.get("UCCL_EP_MAX_INFLIGHT")), timeout_s=timeout_s,
                      heartbeat_s=heartbeat_s, idle_sleep_ns=idle_sleep_ns(),
                      domains=resolve_domains(str(env.get("UCCL_EP_FABRIC_DOMAINS")), rank % ranks_per_node,
                                              provider or env.get("UCCL_EP_FABRIC_PROVIDER") or "")
                      if "fabric" in name else "",
                      check_remote_bounds=check_remote_bounds,
                      cpus=cpus or numa_cpus(numa_node), external_region=int(external_region), **fault_opts)
        proxy = C.Proxy(config)
        try:
            record = proxy.local_info()
            if secret is not None:
                store.set(f"{prefix}/proof/{rank}", _proof(secret, prefix, rank, nonces, record))
            store.set(f"{prefix}/ep/{rank}", record)
            infos = _wait_all(store, prefix, "ep", rank, world, deadline, started, "bootstrap (endpoint records)")
            if secret is not None:
                proofs = _wait_all(store, prefix, "proof", rank, world, deadline, started, "bootstrap (proofs)")
                _check_proofs(secret, prefix, rank, nonces, infos, proofs)
            proxy.connect(infos)
            store.set(f"{prefix}/connected/{rank}", b"1")
            _wait_all(store, prefix, "connected", rank, world, deadline, started, "bootstrap (connect)")
            proxy.finalize_setup()
            proxy.start()
        except BaseException:
            proxy.stop()
            raise
        return proxy
    except (PeerFailure, Timeout):
        raise
    except BaseException as e:
        try:
            store.set(f"{prefix}/error/{rank}", f"{type(e).__name__}: {e}"[:2000])
        except Exception:  # noqa: BLE001 - the store itself may be gone
            pass
        raise
