"""What the cuda executor hands its engines and its proxy session: `EngineContext`.

Engines (LL and normal mode, over NVLink or through the proxy) and the proxy session receive the
device, the Buffer's buffers and peer maps, the error page, the bound of device waits, the host's
error check and barrier -- and nothing else of the executor (cuda/executor.py builds one per Buffer,
after its buffers are mapped). A CPU test checks that the engines read only these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["EngineContext"]


def _no_error() -> None:
    return None


def _no_barrier(phase: str = "barrier", masks: bool = False) -> None:
    return None


@dataclass(frozen=True)
class EngineContext:
    ctx: Any                      # the Buffer's context (executor_interface.BufferContext): group, rank,
    #                               num_ranks, topology, tuning, options, timeout_s, enable_shrink
    device: int
    drv: Any                      # uccl_ep._C.cuda (runtime.driver())
    timeout_ns: int               # the bound of every device wait (gpu_timeout_s)
    errors: Any                   # the error page (MappedHostMemory): the error word at 0, normal mode's
    #                               receive counts at 4 KiB (ht.py)
    error_dev_ptr: int
    owner: Any = None             # the Buffer: handles are issued in its name
    mask_ptr: int = 0             # the rank mask the LL kernels read (shrink.py)
    multi_host: bool = False      # the group spans hosts (the proxy transport reaches them by fabric)
    nvl_mem: Any = None           # this rank's NVL buffer (DeviceMemory) or None
    nvl_peer_base: list = field(default_factory=list)   # every rank's NVL buffer as mapped here
    ll_mem: Any = None            # this rank's low-latency buffer or None
    ll_peer_base: list = field(default_factory=list)    # every rank's LL buffer as mapped here (0: not mapped)
    ll_paths: tuple = ()          # each peer's LL path (ll_hybrid.NVLINK or PROXY; empty: no LL buffer)
    region: Any = None            # one allocation holding both buffers (proxy_session.shared_region) or None
    check_error: Callable[[], None] = _no_error          # raises what a kernel recorded (sticky)
    host_barrier: Callable[..., None] = _no_barrier      # (phase, masks=False): every rank here, bounded
    all_gather: Callable[[bytes, str], list] | None = None  # (payload, phase): every rank's, bounded (GroupStore);
    #                                                         None: no engine may exchange (CPU fakes)
