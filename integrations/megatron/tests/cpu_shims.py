"""Test-only shims that let Megatron-Core 0.19.2 models run on CPU (gloo) in CI.

Megatron-Core's model code assumes CUDA in a few places that have nothing to do with expert
dispatch; the example training script and the MoE tests run its real code paths on CPU with:

- ``torch.cuda.current_device()`` -> "cpu" (scratch buffers such as attention's global memory
  buffer are allocated on "the current device");
- the CUDA RNG tracker's ``fork()`` -> a no-op context (it swaps CUDA RNG states around dropout,
  which the tests set to 0);
- ``typing.override`` on Python 3.11 (megatron.training uses the 3.12 decorator; the
  typing_extensions one is the same no-op);
- torch.compile off (Megatron's jit_fuser), which costs ~10 s per process on 2 cores;
- in the modules of Megatron's DDP, optimizer and schedules (the EP-overlap 1F1B schedule and its
  schedule nodes included), ``torch`` is seen through a proxy that allocates ``device="cuda"``
  scalars on the CPU and makes CUDA streams and events no-ops (those modules keep small flags and
  counters "on the GPU"; CPU tensors finish when an op returns). The stream stand-in is a real
  ``torch.Stream`` on the CPU device and ``Tensor.record_stream`` gets a no-op CPU kernel, since
  the overlap schedule records every cross-stream tensor. Grad clipping asserts CUDA grads, so
  CPU runs use ``--clip-grad 0``.

Nothing here is used on the GPU machine.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
import typing

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
MEGATRON_SRC = os.path.join(REPO, ".cache", "megatron-core-0.19.2")
#: the oldest release of the tested window (ci/setup.d/30-megatron.sh)
MEGATRON_SRC_OLDEST = os.path.join(REPO, ".cache", "megatron-core-0.19.0")
INTEGRATION = os.path.abspath(os.path.join(HERE, ".."))


def add_paths(src: str = MEGATRON_SRC) -> None:
    """Megatron-Core sources (0.19.2 by default; unpacked by ci/setup.sh --test) and this integration.
    ``src`` goes before any other megatron-core tree on sys.path (spawned ranks inherit the parent's)."""
    if not os.path.isdir(os.path.join(src, "megatron", "core")):
        raise RuntimeError(f"Megatron-Core sources missing at {src}: run `ci/setup.sh --test`")
    sys.path[:] = [p for p in sys.path if os.path.basename(p).split("-")[:2] != ["megatron", "core"] or p == src]
    for path in (INTEGRATION, src, HERE):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override


def cpu_model_shims() -> None:
    """Call in each rank before building a Megatron model on CPU."""
    import torch

    torch._dynamo.config.disable = True
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core import tensor_parallel

    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()


def _null_stream_class():
    import torch

    class _NullStream(torch.Stream):
        """A CUDA stream stand-in: CPU work is complete when the op returns, so waits are no-ops.
        Distinct stand-ins compare by identity, as distinct CUDA streams do."""

        def __new__(cls, *args, **kwargs):
            return super().__new__(cls, device="cpu")

        def __init__(self, *args, **kwargs) -> None:
            pass

        __eq__ = object.__eq__
        __ne__ = object.__ne__
        __hash__ = object.__hash__

        def wait_stream(self, *args, **kwargs) -> None:
            pass

        def wait_event(self, *args, **kwargs) -> None:
            pass

        def record_event(self, *args, **kwargs) -> None:
            return None

        def synchronize(self) -> None:
            pass

        @staticmethod
        def priority_range():
            return 0, 0

    return _NullStream


class _NullEvent:
    """A CUDA event stand-in (see _NullStream)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, *args, **kwargs) -> None:
        pass

    def wait(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


_libs: list = []


def _record_stream_on_cpu() -> None:
    """``Tensor.record_stream`` on CPU tensors: nothing to record (idempotent)."""
    import torch

    if not _libs:
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("record_stream", lambda tensor, stream: None, "CPU")
        _libs.append(lib)


def _on_cpu(fn):
    import torch

    def call(*args, **kwargs):
        device = kwargs.get("device")
        if device == "cuda" or (isinstance(device, torch.device) and device.type == "cuda"):
            kwargs["device"] = "cpu"
        return fn(*args, **kwargs)

    return call


def _cpu_torch_proxy():
    import torch

    null_stream = _null_stream_class()
    default_stream = null_stream()
    cuda = types.SimpleNamespace(**{k: getattr(torch.cuda, k) for k in dir(torch.cuda) if not k.startswith("__")})
    cuda.current_device = lambda: "cpu"
    cuda.current_stream = lambda *a, **k: default_stream
    cuda.Stream = null_stream
    cuda.Event = _NullEvent
    cuda.stream = lambda *a, **k: contextlib.nullcontext()
    cuda.synchronize = lambda *a, **k: None
    cuda.empty_cache = lambda *a, **k: None

    class CpuTorch(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

    proxy = CpuTorch("torch")
    for name in ("tensor", "zeros", "ones", "empty", "full"):
        setattr(proxy, name, _on_cpu(getattr(torch, name)))
    proxy.cuda = cuda
    return proxy


_PROXIED = ("megatron.core.optimizer.optimizer", "megatron.core.optimizer.clip_grads",
            "megatron.core.distributed.param_and_grad_buffer", "megatron.core.distributed.distributed_data_parallel",
            "megatron.core.distributed.finalize_model_grads", "megatron.core.pipeline_parallel.schedules",
            "megatron.core.utils", "megatron.core.pipeline_parallel.utils",
            "megatron.core.pipeline_parallel.combined_1f1b", "megatron.core.models.common.model_chunk_schedule_plan",
            "megatron.core.models.common.utils", "megatron.core.models.gpt.fine_grained_callables")


def cpu_training_shims() -> None:
    """`cpu_model_shims` plus the DDP / optimizer / schedule proxy (call in each rank)."""
    cpu_model_shims()
    _record_stream_on_cpu()
    proxy = _cpu_torch_proxy()
    for name in _PROXIED:
        importlib.import_module(name).torch = proxy
