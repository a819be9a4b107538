"""A LowLatencyEngine's context over the HIP stand-in runtime (hip_standin.c), for the scripts the
stand-in tests and tools/lab/host_path_standin.py run in a child process: rank 0 of 2 on a ROCm torch
as far as uccl_ep can tell (CPU tensors), the peer's buffer its own opened again by IPC handle."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from uccl_ep.cuda import ll, runtime
from uccl_ep.cuda.engine_context import EngineContext
from uccl_ep.tuning import Tuning


_alive: list = []  # the mask words of every context made (the contexts hold only their address)


class KernelError(Exception):
    """What the context's check_error raises for a nonzero error word."""


def engine_context(tuning: Tuning, ll_bytes: int):
    """-> (EngineContext, its error page (MappedHostMemory), its LL buffer (DeviceMemory))."""
    torch.version.hip, torch.version.cuda = "7.2.0", None
    torch.cuda.synchronize = lambda *a, **k: None  # the stand-in completes every call at once
    ll.current_stream = lambda device=None: 0x5150  # torch's current stream, as the engine reads it
    drv = runtime.driver()
    errors = runtime.MappedHostMemory(0, 16384)
    mem = runtime.DeviceMemory(0, ll_bytes)
    handles = [mem.ipc_handle(), mem.ipc_handle()]
    mask = runtime.DeviceMemory(0, 8)

    def check_error():
        if errors.int32(0) != 0:
            raise KernelError(errors.int32(0))

    ec = EngineContext(ctx=SimpleNamespace(num_ranks=2, rank=0, enable_shrink=False, tuning=tuning), device=0,
                       drv=drv, timeout_ns=10**9, errors=errors, error_dev_ptr=errors.dev_ptr, mask_ptr=mask.ptr,
                       ll_mem=mem, ll_peer_base=[mem.ptr, mem.open_peer(handles[1])], check_error=check_error)
    _alive.append(mask)
    return ec, errors, mem
