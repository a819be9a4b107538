"""No silent fallback: what `backend="auto"` gives GPU tensors, named backends that cannot serve,
the host executor's device check, `uccl-ep doctor`'s available backends, and logging through
the standard `logging` module with UCCL_EP_LOG_LEVEL.

GPU tensors are simulated on this CPU machine by making torch report a CUDA device in the rank
(`torch.cuda.is_available` -> True): the cuda executor is then still unavailable (no driver), which
is exactly the situation of a GPU host without nvcc or an AMD host.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch

from multirank import run_ranks
from uccl_ep.errors import InvalidArgument, Unsupported

pytestmark = pytest.mark.cpu


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelno, record.name, record.getMessage()))


def _auto_worker(rank, world, pretend_gpu):
    import torch.distributed as dist

    import uccl_ep
    from uccl_ep import log

    if pretend_gpu:
        torch.cuda.is_available = lambda: True
    handler = _Records()
    logging.getLogger("uccl_ep").addHandler(handler)
    logging.getLogger("uccl_ep").setLevel(logging.DEBUG)
    log.reset_warn_once()
    backends = []
    for _ in range(2):
        buf = uccl_ep.Buffer(dist.group.WORLD, 1 << 20, 0, explicitly_destroy=True, backend="auto")
        backends.append(buf.backend)
        buf.destroy()
    warnings = [m for lvl, _, m in handler.records if lvl == logging.WARNING]
    return {"backends": backends, "warnings": warnings}


def test_auto_on_cpu_tensors_is_host_without_warning():
    out = run_ranks(_auto_worker, 2, False, timeout_s=120)
    for r in out:
        assert r["backends"] == ["host", "host"] and r["warnings"] == []


def test_auto_never_gives_gpu_tensors_a_cpu_executor_and_warns_once():
    out = run_ranks(_auto_worker, 2, True, timeout_s=120)
    for r in out:
        assert r["backends"] == ["reference", "reference"], r
        assert len(r["warnings"]) == 1, r["warnings"]  # two Buffers, one warning
        msg = r["warnings"][0]
        assert "NOT the fast CUDA-kernel path" in msg and "uccl-ep doctor" in msg and "UCCL_EP_BACKEND=cuda" in msg
        assert "cuda:" in msg and "host: serves CPU tensors only" in msg  # the reasons, per executor


def _named_worker(rank, world, name):
    import torch.distributed as dist

    import uccl_ep

    try:
        uccl_ep.Buffer(dist.group.WORLD, 1 << 20, 0)
    except Unsupported as e:
        return str(e)
    return None


def test_uccl_ep_backend_cuda_without_cuda_is_an_error():
    out = run_ranks(_named_worker, 2, "cuda", timeout_s=120, env={"UCCL_EP_BACKEND": "cuda"})
    for msg in out:
        assert msg is not None and "backend 'cuda'" in msg and "UCCL_EP_BACKEND" in msg and "uccl-ep doctor" in msg


def _device_check_worker(rank, world):
    import torch.distributed as dist

    import uccl_ep
    from uccl_ep.host.executor import _require_cpu

    buf = uccl_ep.Buffer(dist.group.WORLD, 1 << 20, 0, explicitly_destroy=True, backend="host")
    errors = []
    meta = torch.empty(4, 64, dtype=torch.bfloat16, device="meta")
    try:
        _require_cpu("dispatch", "x", meta)
    except InvalidArgument as e:
        errors.append(str(e))
    try:  # through the executor's own entry point, as a Buffer call reaches it
        buf._executor.combine(meta, None, None, None, None)
    except InvalidArgument as e:
        errors.append(str(e))
    buf.destroy()
    return errors


def test_host_executor_refuses_non_cpu_tensors():
    for errors in run_ranks(_device_check_worker, 2, timeout_s=120):
        assert len(errors) == 2
        assert all("a CPU tensor" in e and "meta" in e for e in errors), errors
        assert "`combine: x`" in errors[1]


def test_doctor_lists_backends_available_here():
    proc = subprocess.run([sys.executable, "-m", "uccl_ep.cli.main", "doctor", "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    avail = json.loads(proc.stdout)["backends_available"]
    assert avail["reference"] is None and avail["host"] is None
    assert avail["cuda"] == "torch sees no CUDA device"  # this CI machine
    human = subprocess.run([sys.executable, "-m", "uccl_ep.cli.main", "doctor"], capture_output=True, text=True,
                           timeout=120, env={**__import__("os").environ, "COLUMNS": "200"})
    assert "backends available here" in human.stdout and "unavailable: torch sees no CUDA device" in human.stdout


_LOG_CODE = """
import tempfile, torch.distributed as dist, uccl_ep
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
b = uccl_ep.Buffer(dist.group.WORLD, 1 << 20, 0, explicitly_destroy=True, backend="reference")
b.destroy()
"""


def _run_log(env_level):
    env = dict(__import__("os").environ)
    env.pop("UCCL_EP_LOG_LEVEL", None)
    if env_level is not None:
        env["UCCL_EP_LOG_LEVEL"] = env_level
    return subprocess.run([sys.executable, "-c", _LOG_CODE], capture_output=True, text=True, timeout=120, env=env)


def test_log_level_from_registry():
    info = _run_log("info")
    assert info.returncode == 0, info.stderr[-2000:]
    assert info.stderr.count("[uccl_ep.buffer INFO] Buffer rank 0/1: backend=reference") == 1
    quiet = _run_log(None)
    assert quiet.returncode == 0 and "Buffer rank" not in quiet.stderr
    bad = _run_log("loud")
    assert bad.returncode != 0 and "UCCL_EP_LOG_LEVEL" in bad.stderr and "InvalidArgument" in bad.stderr


def test_plugin_loggers_are_below_uccl_ep():
    from uccl_ep.log import get_logger

    assert get_logger("sglang").name == "uccl_ep.sglang"
    assert get_logger("uccl_ep.buffer").name == "uccl_ep.buffer"
    assert get_logger("sglang").parent is logging.getLogger("uccl_ep")
