"""The cuda executor with a failed peer, host side, on CPU: the watch of the peers' processes on this
host (uccl_ep/cuda/liveness.py) records PeerFailure in the error word the kernels' bounded waits
check, the executor raises it naming the peer, and destroy() releases everything even when steps fail
(a peer's memory that will not close, a failed context).

The kernels ending their waits on that word and the whole recovery on GPUs:
core/tests/gpu/test_cuda_recovery.py.
"""

import ctypes
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from uccl_ep import _C
from uccl_ep.cuda import liveness
from uccl_ep.errors import DeviceError, InvalidArgument, PeerFailure

pytestmark = pytest.mark.cpu


def _child():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _record(pid):
    state, start = liveness._stat(pid)
    return liveness._boot_id(), pid, start


def test_a_process_that_exits_is_gone_zombie_or_reaped():
    child = _child()
    try:
        rec = _record(child.pid)
        assert liveness.watchable(rec) and liveness.process_gone(rec) is None
        child.kill()
        deadline = time.monotonic() + 5
        while liveness.process_gone(rec) is None:  # a zombie until its parent reaps it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert "exited" in liveness.process_gone(rec)
        child.wait()
        assert liveness.process_gone(rec) == f"its process (pid {child.pid}) exited"
        # a pid reused by another process is not the peer
        assert "another process" in liveness.process_gone((rec[0], liveness.process_record()[1], rec[2]))
    finally:
        child.kill()
        child.wait()


def test_watch_reports_the_first_peer_gone_and_ignores_unseen_peers():
    child = _child()
    calls, seen = [], threading.Event()
    try:
        records = [liveness.process_record(), ("another-boot", child.pid, 1), _record(child.pid),
                   None, _record(child.pid)]
        watch = liveness.PeerWatch(0, records, lambda peer, why: (calls.append((peer, why)), seen.set()), 0.02)
        assert sorted(watch.peers) == [2, 4]  # not itself, not another host's or an unknown record
        time.sleep(0.1)
        assert calls == []
        child.kill()
        assert seen.wait(5.0)
        time.sleep(0.1)
        assert calls == [(2, f"its process (pid {child.pid}) exited (state Z)")] or \
            calls == [(2, f"its process (pid {child.pid}) exited")]
        watch.close()
        assert not any(t.name == "uccl_ep-peerwatch" for t in threading.enumerate())
    finally:
        child.kill()
        child.wait()


def test_no_thread_without_peers_to_watch():
    watch = liveness.PeerWatch(0, [liveness.process_record(), ("another-boot", 1, 1)], lambda p, w: None, 0.01)
    assert watch.peers == {} and not any(t.name == "uccl_ep-peerwatch" for t in threading.enumerate())
    watch.close()


class _Words:
    """An ErrorWord (kernel_abi.h) in plain host memory, read like MappedHostMemory."""

    def __init__(self):
        self.buf = (ctypes.c_int32 * 16)()
        self.host_ptr = ctypes.addressof(self.buf)

    def int32(self, i):
        return self.buf[i]

    def int32_array(self, i, n):
        return list(self.buf[i:i + n])


def test_host_error_first_wins_and_arguments_are_checked():
    w = _Words()
    assert _C.cuda.raise_host_error(w.host_ptr, 5, 13, 0, 3)
    assert not _C.cuda.raise_host_error(w.host_ptr, 1, 4, 0, 2, 7)  # a later error does not overwrite
    assert w.int32_array(0, 6) == [5, 13, 0, 3, -1, 0]
    with pytest.raises(InvalidArgument, match="word"):
        _C.cuda.raise_host_error(0, 5, 13, 0, 3)
    with pytest.raises(InvalidArgument, match="code"):
        _C.cuda.raise_host_error(_Words().host_ptr, 0, 13, 0, 3)


def _executor(**kw):
    from uccl_ep.cuda.executor import CudaExecutor
    ex = CudaExecutor.__new__(CudaExecutor)
    ex.__dict__.update(dict(_failure=None, errors=_Words(), _ht=None, _ll=None, device=0, drv=_C.cuda,
                            ctx=SimpleNamespace(rank=1, enable_shrink=False)), **kw)
    return ex


def test_peer_gone_fails_the_buffer_with_peer_failure_naming_it():
    """What the watch calls: the error word gets kErrPeerGone, and the next check raises PeerFailure
    naming this rank, the peer and why (sticky, as every device error)."""
    ex = _executor()
    ex.check_error()
    ex._peer_gone(2, "its process (pid 1234) exited")
    for _ in range(2):
        with pytest.raises(PeerFailure, match=r"rank 1: peer 2 failed during 'liveness': its process \(pid 1234\) "
                                              r"exited; the buffer is unusable") as info:
            ex.check_error()
        assert (info.value.rank, info.value.peer, info.value.phase) == (1, 2, "liveness")


class _Step:
    def __init__(self, log, name, error=None):
        self.log, self.name, self.error = log, name, error

    def __call__(self):
        self.log.append(self.name)
        if self.error is not None:
            raise self.error


def test_destroy_releases_everything_when_steps_fail(monkeypatch):
    """A peer gone can make a step fail (closing its memory, a context that failed): every other
    resource is released all the same, and the first error is raised after the last step."""
    import torch
    log = []
    err = DeviceError("cuIpcCloseMemHandle", 1, "CUDA_ERROR_INVALID_VALUE", "invalid argument")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append("synchronize"))
    mem = lambda name, e=None: SimpleNamespace(free=_Step(log, name, e))  # noqa: E731
    ex = _executor(_watch=SimpleNamespace(close=_Step(log, "watch")), nvl_mem=mem("nvl", err), ll_mem=mem("ll"),
                   mask=mem("mask"), channel=SimpleNamespace(close=_Step(log, "channel")), errors=mem("errors"),
                   _ll=SimpleNamespace(close=_Step(log, "ll close", RuntimeError("context failed")), work=mem("ll work")),
                   _ht=SimpleNamespace(close=_Step(log, "ht close"), free=_Step(log, "ht free")))
    with pytest.raises(RuntimeError, match="context failed"):
        ex.destroy()
    assert log == ["watch", "synchronize", "ll close", "ht close", "nvl", "ll", "mask", "channel", "ll work",
                   "ht free", "errors"]


def test_device_memory_is_freed_when_a_peer_mapping_will_not_close(monkeypatch):
    from uccl_ep.cuda import runtime
    calls = []

    def close(dev, p):
        calls.append(("close", p))
        raise DeviceError("cuIpcCloseMemHandle", 1, "CUDA_ERROR_INVALID_VALUE", "invalid argument")

    drv = SimpleNamespace(ipc_close_handle=close, mem_free=lambda dev, p: calls.append(("free", p)))
    monkeypatch.setattr(runtime, "driver", lambda: drv)
    m = runtime.DeviceMemory.__new__(runtime.DeviceMemory)
    m.device, m.nbytes, m.ptr, m._peers = 0, 4096, 0x1000, [0x2000, 0x3000]
    m.free()
    assert calls == [("close", 0x2000), ("close", 0x3000), ("free", 0x1000)] and m.ptr == 0
    m.free()  # idempotent
    assert len(calls) == 3
