"""Executors behind `uccl_ep.Buffer` and how `backend="auto"` picks one.

The interface every executor implements, and the context it serves, are in
`uccl_ep.executor_interface`; this module is the registry and the choice of `backend="auto"`.

| name        | tensors | moves data with                                   |
|-------------|---------|---------------------------------------------------|
| `reference` | any     | torch.distributed collectives (gloo / NCCL)       |
| `host`      | CPU     | host threads -> queue -> proxy -> transport       |
| `cuda`      | CUDA    | JIT kernels -> NVLink stores / queue -> proxy     |

`cuda` runs on the GPU runtime torch was built for: libcuda, or libamdhip64 under a ROCm torch
(`torch.version.hip`; kernels compiled by hipcc for the device's gfx target, docs/amd.md).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from .errors import InvalidArgument, Unsupported
from .executor_interface import BufferContext, Executor
from .log import get_logger, warn_once

__all__ = ["register_executor", "available_backends", "available_here", "expects_gpu_tensors", "create_executor"]

logger = get_logger(__name__)


_REGISTRY: dict[str, tuple[Callable[[], type[Executor]], Callable[[BufferContext], str | None]]] = {}
_MACHINE_CHECKS: dict[str, Callable[[], str | None]] = {}
#: device type of the tensors each executor runs (None: any), for the fallback rule of `auto`
_DEVICE_TYPES: dict[str, str | None] = {}


def register_executor(name: str, loader: Callable[[], type[Executor]],
                      unavailable_reason: Callable[[BufferContext], str | None],
                      machine_unavailable_reason: Callable[[], str | None] = lambda: None,
                      device_type: str | None = None) -> None:
    """Register an executor: ``loader`` imports its class lazily; ``unavailable_reason(ctx)``
    returns None when it can serve ``ctx`` on this machine, else why not (for errors/doctor);
    ``machine_unavailable_reason()`` answers the same for this machine alone, without a Buffer
    (`uccl-ep doctor`); ``device_type`` is the device of the tensors it runs (None: any)."""
    _REGISTRY[name] = (loader, unavailable_reason)
    _MACHINE_CHECKS[name] = machine_unavailable_reason
    _DEVICE_TYPES[name] = device_type


def available_backends(ctx: BufferContext) -> dict[str, str | None]:
    return {name: check(ctx) for name, (_, check) in _REGISTRY.items()}


def available_here() -> dict[str, str | None]:
    """Each registered executor -> None when this machine can run it, else why not (no Buffer,
    no process group, no GPU context beyond torch's device queries)."""
    out: dict[str, str | None] = {}
    for name, check in _MACHINE_CHECKS.items():
        try:
            out[name] = check()
        except Exception as e:  # noqa: BLE001 - a report: the reason is the exception
            out[name] = f"{type(e).__name__}: {e}"
    return out


# Preference of `backend="auto"`: the fastest first.
_AUTO_ORDER = ("cuda", "host", "reference")
_DOCTOR_HINT = "run `uccl-ep doctor` to see what this machine lacks"


def expects_gpu_tensors(ctx: BufferContext) -> bool:
    """Whether a Buffer on ``ctx`` will be handed GPU tensors: torch sees a CUDA (or ROCm) device,
    or the group is NCCL. A gloo group on a GPU machine (vLLM's cpu_group) still carries GPU
    tensors, so the group alone does not decide."""
    if torch.cuda.is_available():
        return True
    try:
        return "nccl" in str(dist.get_backend(ctx.group)).lower()
    except Exception:  # noqa: BLE001 - a group without a backend name: decided by torch alone
        return False


def create_executor(requested: str, ctx: BufferContext, owner: object) -> Executor:
    """The executor for ``requested`` ("auto" or a registered name; the Buffer resolves
    ``UCCL_EP_BACKEND`` before calling).

    ``auto`` never gives GPU tensors a CPU executor, and when it cannot give them the fastest
    one (``cuda``) it says so once per process at WARNING, with the reason and the fix. A named
    backend that cannot serve the Buffer is an error, never a fallback.
    """
    if requested not in ("auto", *_REGISTRY):
        raise InvalidArgument("backend", f"one of auto, {', '.join(_REGISTRY)}", repr(requested))
    if requested != "auto":
        loader, check = _REGISTRY[requested]
        reason = check(ctx)
        if reason is not None:
            raise Unsupported(f"backend '{requested}' (the backend= argument or UCCL_EP_BACKEND) cannot serve this "
                              f"Buffer: {reason}; {_DOCTOR_HINT}, or choose another backend")
        return loader()(ctx, owner)
    gpu = expects_gpu_tensors(ctx)
    skipped: list[str] = []
    for name in _AUTO_ORDER:
        if name not in _REGISTRY:
            continue
        if gpu and _DEVICE_TYPES.get(name) == "cpu":
            skipped.append(f"{name}: serves CPU tensors only")
            continue
        reason = _REGISTRY[name][1](ctx)
        if reason is not None:
            skipped.append(f"{name}: {reason}")
            continue
        if gpu and name != _AUTO_ORDER[0]:
            warn_once(logger, f"auto-fallback:{name}",
                      "uccl_ep: backend=\"auto\" gave this Buffer's GPU tensors the '%s' executor, NOT the fast "
                      "CUDA-kernel path (%s). Communication will be much slower. Fix: %s; set "
                      "UCCL_EP_BACKEND=cuda to make this an error instead, or UCCL_EP_BACKEND=%s to accept it "
                      "silently.", name, "; ".join(skipped), _DOCTOR_HINT, name)
        else:
            logger.debug("backend=auto -> %s (%s tensors)%s", name, "GPU" if gpu else "CPU",
                         f"; skipped {'; '.join(skipped)}" if skipped else "")
        return _REGISTRY[name][0]()(ctx, owner)
    raise Unsupported(f"no uccl_ep backend can serve this Buffer ({'; '.join(skipped)}); {_DOCTOR_HINT}")


def _reference_loader() -> type[Executor]:
    from .refs.executor import ReferenceExecutor
    return ReferenceExecutor


register_executor("reference", _reference_loader, lambda ctx: None)


def _cuda_loader() -> type[Executor]:
    from .cuda import load_executor
    return load_executor()


def _cuda_unavailable(ctx: BufferContext) -> str | None:
    from .cuda import unavailable_reason
    return unavailable_reason(ctx)


def _cuda_machine_unavailable() -> str | None:
    # NOTES: the machine-level part of cuda.executor.unavailable_reason (device, driver, nvcc);
    # what depends on a group (ranks per host, proxy paths) is decided when a Buffer is built.
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    from .cuda.runtime import driver_unavailable_reason
    why = driver_unavailable_reason()
    if why:
        return why
    from .cuda.jit import find_nvcc
    try:
        find_nvcc()
    except Exception as e:  # noqa: BLE001 - MissingDependency: the reason is reported
        return str(e)
    return None


register_executor("cuda", _cuda_loader, _cuda_unavailable, _cuda_machine_unavailable, device_type="cuda")


def _host_loader() -> type[Executor]:
    from .host.executor import HostExecutor
    return HostExecutor


def _host_unavailable(ctx: BufferContext) -> str | None:
    from .host.executor import unavailable_reason
    return unavailable_reason(ctx)


def _host_machine_unavailable() -> str | None:
    from .host.executor import machine_unavailable_reason
    return machine_unavailable_reason()


register_executor("host", _host_loader, _host_unavailable, _host_machine_unavailable, device_type="cpu")
