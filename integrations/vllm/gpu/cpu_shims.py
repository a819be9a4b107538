"""CPU stand-ins for the CUDA-only pieces under vLLM's modular MoE kernel and its DBO micro-batching.

Used by drive_modular_kernel.py with ``--device cpu`` (CI has no GPU and no compiled ``vllm._C``);
never on a GPU machine. Each stand-in keeps the contract of what it replaces:

- ``torch.ops._C.silu_and_mul`` (vLLM's compiled activation, schema of vLLM's csrc
  ``silu_and_mul(Tensor! result, Tensor input) -> ()``) computed with vLLM's own
  ``SiluAndMul.forward_native``; registered only when absent;
- vLLM's per-token-group FP8 quantization (a CUDA kernel or Triton), as the fused-MoE utils call
  it: e4m3 values and fp32 scales ``amax / fp8_max`` per group of ``group_size`` channels;
- the batched experts' "is a CUDA graph being captured" test (it asks the accelerator's current
  stream, which a GPU-less machine with the CUDA wheel cannot give): no capture happens on CPU,
  so only torch.compile is asked;
- CUDA streams and events for vLLM's ubatching (DBO): on CPU an op has finished when it returns,
  so stream waits, event records and ``Tensor.record_stream`` have nothing to order and are
  no-ops; which stream is current is still tracked by vLLM's own ``current_stream()`` /
  patched ``torch.cuda.set_stream``, so UBatchContext's stream assertions keep their meaning.
"""

from __future__ import annotations

import contextlib
import types

import torch

__all__ = ["install_kernels", "install_streams", "CpuStream", "CpuEvent"]

_libs: list = []  # torch.library registrations live as long as their Library object


def _silu_and_mul(result: torch.Tensor, x: torch.Tensor) -> None:
    from vllm.model_executor.layers.activation import SiluAndMul

    result.copy_(SiluAndMul.forward_native(x))


def _per_token_group_quant_fp8(x: torch.Tensor, group_size: int, eps: float = 1e-10, dtype=None,
                               column_major_scales: bool = False, out_q=None, use_ue8m0=None, **_unused):
    if use_ue8m0:
        raise NotImplementedError("the CPU stand-in of per_token_group_quant_fp8 has no UE8M0 scales")
    dtype = torch.float8_e4m3fn if dtype is None else dtype
    fmax = torch.finfo(dtype).max
    *lead, h = x.shape
    groups = x.float().reshape(*lead, h // group_size, group_size)
    scale = groups.abs().amax(dim=-1).clamp_min(eps) / fmax
    q = (groups / scale.unsqueeze(-1)).clamp(-fmax, fmax).to(dtype).reshape(x.shape)
    if out_q is not None:
        out_q.copy_(q)
        q = out_q
    if column_major_scales:
        scale = scale.transpose(-1, -2).contiguous().transpose(-1, -2)
    return q, scale


def install_kernels() -> None:
    """Register the activation op when missing and route the fused-MoE FP8 group quantization to
    the torch version (idempotent)."""
    if not hasattr(torch.ops._C, "silu_and_mul"):
        lib = torch.library.Library("_C", "FRAGMENT")
        lib.define("silu_and_mul(Tensor! result, Tensor input) -> ()")
        lib.impl("silu_and_mul", _silu_and_mul, "CPU")
        _libs.append(lib)
    import vllm.model_executor.layers.fused_moe.utils as fused_moe_utils

    fused_moe_utils.per_token_group_quant_fp8 = _per_token_group_quant_fp8
    import vllm.model_executor.layers.fused_moe.experts.fused_batched_moe as batched

    batched._is_capturing_or_compiling = torch.compiler.is_compiling


class CpuEvent:
    """A CUDA event stand-in: CPU work is complete when the op returns."""

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class CpuStream(torch.Stream):
    """A CUDA stream stand-in (a real ``torch.Stream`` on the CPU device, so
    ``Tensor.record_stream`` accepts it). Streams compare by identity, as distinct CUDA streams do."""

    def __new__(cls):
        return super().__new__(cls, device="cpu")

    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def record_event(self, event=None):
        return event if event is not None else CpuEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def install_streams() -> tuple[CpuStream, CpuStream]:
    """Make vLLM's ubatching run on CPU; returns (compute_stream, comm_stream) for
    ``make_ubatch_contexts``. Idempotent per process."""
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.worker.ubatching as ubatching
    from vllm.platforms import current_platform

    if getattr(ubatching.torch, "__uccl_ep_cpu__", False):
        return ubatching.torch.__streams__
    default, compute, comm = CpuStream(), CpuStream(), CpuStream()
    # NOTES: vLLM asks the platform for the first current stream of a thread on platforms other
    # than CUDA/ROCm/CPU; a GPU-less machine with the CUDA wheel is such a platform.
    if not (current_platform.is_cuda_alike() or current_platform.is_cpu()):
        current_platform.current_stream = lambda: default
    # vLLM's patched torch.cuda.set_stream records the stream, then calls the real one (CUDA only).
    real_set_stream = torch_utils.prev_set_stream
    torch_utils.prev_set_stream = lambda s: None if isinstance(s, CpuStream) else real_set_stream(s)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("record_stream", lambda tensor, stream: None, "CPU")
    _libs.append(lib)

    @contextlib.contextmanager
    def stream_context(stream):
        previous = torch_utils.current_stream()
        torch.cuda.set_stream(stream)
        try:
            yield
        finally:
            torch.cuda.set_stream(previous)

    cuda = types.SimpleNamespace(stream=stream_context, set_stream=lambda s: torch.cuda.set_stream(s))

    class CpuTorch(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

    proxy = CpuTorch("torch")
    proxy.Event = CpuEvent
    proxy.cuda = cuda
    proxy.__uccl_ep_cpu__ = True
    proxy.__streams__ = (compute, comm)
    ubatching.torch = proxy
    return compute, comm
