"""Device runtime for the CUDA executor: the lazy driver, loaded kernels, launches, memory.

Everything goes through `uccl_ep._C.cuda`: libcuda, or libamdhip64 under a ROCm torch (both by
dlopen, behind one interface: core/csrc/runtime/cuda_driver.h); torch is used only for tensors and
the current stream. Kernels take one parameter struct (core/kernels/include/uccl_ep/kernel_abi.h)
that `pack_params` builds from the header's own field list.
"""

from __future__ import annotations

import ctypes
import operator
import re
import struct
import threading
from functools import lru_cache
from typing import Any

import torch

from .. import env
from ..errors import MissingDependency, UcclEpError
from . import jit

__all__ = ["tensor_ptr", "driver", "driver_unavailable_reason", "torch_gpu_runtime", "Kernel", "load_kernel", "pack_params", "ParamCache", "param_fields",
           "abi_enum",
           "DeviceMemory", "MappedHostMemory", "raw_tensor", "current_stream", "device_arch", "warp_size",
           "free_after_device"]


def torch_gpu_runtime() -> str:
    """The GPU runtime torch was built for: "hip" (ROCm torch), "cuda", or "auto" (a CPU-only torch)."""
    if getattr(torch.version, "hip", None):
        return "hip"
    return "cuda" if torch.version.cuda else "auto"


def _select(native) -> tuple[bool, str]:
    """Choose the runtime torch uses (once per process; the native side refuses a switch).

    NOTES: named, never guessed: a ROCm torch gets the HIP runtime or an error saying why not, not
    libcuda because one happens to be installed."""
    try:
        return native.select_runtime(torch_gpu_runtime())
    except RuntimeError as e:  # the process already uses the other runtime
        return False, str(e)


_driver = None  # the bound module once selected (a process keeps its runtime: _select)


def driver():
    """`uccl_ep._C.cuda` bound to torch's GPU runtime, or MissingDependency when it cannot be used.
    NOTES: on every launch's host path; the selection, once made, cannot change in the process,
    so it is asked once."""
    global _driver
    if _driver is not None:
        return _driver
    from .. import _C
    ok, why = _select(_C.cuda)
    if not ok:
        raise MissingDependency(why)
    _driver = _C.cuda
    return _driver


def driver_unavailable_reason() -> str | None:
    try:
        from .. import _C
    except ImportError as e:  # pragma: no cover - broken build
        return f"native module missing: {e}"
    ok, why = _select(_C.cuda)
    return None if ok else why


# ---- kernel parameters ----------------------------------------------------------------------------
_STRUCT_RE = re.compile(r"struct\s+(\w+)\s*\{(.*?)\};", re.S)
_FIELD_RE = re.compile(r"^\s*(\w+)\s+(\w+)\s*;", re.M)


@lru_cache(maxsize=1)
def _abi_structs() -> dict[str, list[tuple[str, str]]]:
    """Every kernel parameter struct (``*Params``) of kernel_abi*.h as its 8-byte fields in order,
    (C type, name); a member that is itself a struct of the headers (HTRingGeometry) is expanded into
    its fields, named ``member.field``."""
    bodies: dict[str, str] = {}
    # kernel_abi.h and its per-path companions (kernel_abi_*.h)
    for header in sorted((jit.include_dir() / "uccl_ep").glob("kernel_abi*.h")):
        bodies.update(_STRUCT_RE.findall(header.read_text()))

    def fields(name: str, prefix: str = "") -> list[tuple[str, str]]:
        out = []
        for typ, field in _FIELD_RE.findall(bodies[name]):
            if typ in ("int64_t", "uint64_t"):
                out.append((typ, prefix + field))
            elif typ in bodies:
                out.extend(fields(typ, f"{prefix}{field}."))
            else:
                raise TypeError(f"{name}.{field}: a kernel parameter is an int64_t, a uint64_t or a struct of "
                                f"them, not {typ}")
        return out

    return {name: fields(name) for name in bodies if name.endswith("Params")}


_ENUM_RE = re.compile(r"enum\s+(\w+)\s*:\s*int\s*\{(.*?)\};", re.S)
_ENUMERATOR_RE = re.compile(r"\b(k\w+)\s*=\s*(-?\d+)")


@lru_cache(maxsize=None)
def abi_enum(name: str) -> dict[str, int]:
    """The enumerators of ``enum <name> : int`` in the kernel ABI headers (kernel_abi*.h), so the host
    names error codes and phases from the same source as the kernels."""
    for header in sorted((jit.include_dir() / "uccl_ep").glob("kernel_abi*.h")):
        for enum_name, body in _ENUM_RE.findall(header.read_text()):
            if enum_name == name:
                return {k: int(v) for k, v in _ENUMERATOR_RE.findall(body)}
    raise KeyError(f"enum {name} : int not found in the kernel ABI headers")


def param_fields(struct_name: str) -> list[str]:
    return [f for _, f in _abi_structs()[struct_name]]


@lru_cache(maxsize=None)
def _packer(struct_name: str) -> tuple[struct.Struct, tuple[str, ...], frozenset[str], Any]:
    fields = _abi_structs()[struct_name]
    fmt = "<" + "".join("Q" if t == "uint64_t" else "q" for t, _ in fields)
    names = tuple(f for _, f in fields)
    top = frozenset(f.split(".")[0] for f in names)
    return struct.Struct(fmt), names, top, operator.itemgetter(*names)


def _flatten(values: dict[str, Any]) -> dict[str, Any]:
    """Struct members given as dicts of their fields -> those fields under dotted names."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update((f"{key}.{k}", v) for k, v in value.items())
        else:
            flat[key] = value
    return flat


def pack_params(struct_name: str, **values: Any) -> bytes:
    """Pack a kernel parameter struct; every field must be given (integers: pointers, sizes, bools),
    a struct member as a dict of its fields (``ring={"msg_bytes": ..., ...}``).

    NOTES: on every launch's host path (an eager LL call packs four), so the layout is parsed once
    per struct, the check is one set comparison and the values are taken in field order by one C
    call (struct refuses anything that is not an integer, where int() would truncate a float)."""
    packer, names, top, in_order = _packer(struct_name)
    if values.keys() != top:
        missing = sorted(top - values.keys())
        raise TypeError(f"{struct_name}: missing {missing}, unknown {sorted(set(values) - top)}")
    if len(top) != len(names):  # struct members: their fields under dotted names
        flat = _flatten(values)
        if flat.keys() != set(names):
            raise TypeError(f"{struct_name}: missing {sorted(set(names) - flat.keys())}, unknown "
                            f"{sorted(flat.keys() - set(names))}")
        values = flat
    got = in_order(values)
    return packer.pack(*got) if len(names) > 1 else packer.pack(got)


class ParamTemplate:
    """A kernel parameter struct with every field fixed but ``dynamic`` ones (the per-call tensor
    pointers), packed per call by `pack` with those in order.

    NOTES: an eager LL op packs two structs per phase; with the fixed fields resolved once per
    (layout, buffer set, flags) the per-call work is a list copy and one struct.pack."""

    def __init__(self, struct_name: str, dynamic: tuple[str, ...], **static: Any) -> None:
        packer, names, _, _ = _packer(struct_name)
        flat = _flatten(static)
        given = flat.keys() | set(dynamic)
        if given != set(names) or len(dynamic) != len(set(dynamic)) or flat.keys() & set(dynamic):
            raise TypeError(f"{struct_name}: missing {sorted(set(names) - given)}, unknown {sorted(given - set(names))}, "
                            f"both fixed and per call {sorted(flat.keys() & set(dynamic))}")
        self._packer = packer
        self._values = [flat.get(n, 0) for n in names]
        self._slots = tuple(names.index(d) for d in dynamic)
        packer.pack(*self._values)  # the fixed fields' types are checked once, here

    def pack(self, *values: int) -> bytes:
        if len(values) != len(self._slots):
            raise TypeError(f"{len(self._slots)} per-call fields, got {len(values)}")
        out = self._values.copy()
        for slot, value in zip(self._slots, values):
            out[slot] = value
        return self._packer.pack(*out)

    def launch_spec(self, kernel: "Kernel", block: int, smem: int = 0) -> tuple:
        """One launch of a `_C.cuda.OpPlan` (core/csrc/runtime/launch_plan.h): (device, function, block,
        smem, the fixed fields' bytes, the per-call fields' indices in `pack`'s order)."""
        kernel.allow_smem(smem)
        return (kernel.device, kernel.function, block, smem, self._packer.pack(*self._values), list(self._slots))


class ParamCache:
    """Packs one kernel parameter struct per call from its per-call tensor pointers (``dynamic``, in
    order) and the values of every other field (``fixed``, in order), which key a `ParamTemplate`
    made on first use: so the fixed values are always exactly those of the call.

    NOTES: on every normal-mode op's host path: `pack_params` builds and checks a dict of every
    field per call, a sizeable share of a small op's host time (docs/benchmarks.md); a call with the
    fixed values of an earlier one copies a list and packs once."""

    def __init__(self, struct_name: str, dynamic: tuple[str, ...], fixed: tuple[str, ...], limit: int = 32) -> None:
        _, names, _, _ = _packer(struct_name)
        given = dynamic + fixed
        if sorted(given) != sorted(names):
            raise TypeError(f"{struct_name}: missing {sorted(set(names) - set(given))}, unknown "
                            f"{sorted(set(given) - set(names))}, twice {sorted(n for n in set(given) if given.count(n) > 1)}")
        self.struct_name, self.dynamic, self.fixed, self._limit = struct_name, dynamic, fixed, limit
        self._templates: dict[tuple, ParamTemplate] = {}

    def pack(self, fixed_values: tuple, *dynamic_values: int) -> bytes:
        template = self._templates.get(fixed_values)
        if template is None:
            if len(fixed_values) != len(self.fixed):
                raise TypeError(f"{self.struct_name}: {len(self.fixed)} fixed fields, got {len(fixed_values)}")
            template = ParamTemplate(self.struct_name, self.dynamic, **dict(zip(self.fixed, fixed_values)))
            if len(self._templates) >= self._limit:
                self._templates.clear()
            self._templates[fixed_values] = template
        return template.pack(*dynamic_values)


# ---- kernels --------------------------------------------------------------------------------------
class Kernel:
    """One loaded kernel function of one device."""

    def __init__(self, device: int, function: int, name: str) -> None:
        self.device, self.function, self.name = device, function, name
        self._smem_set = 0
        self._launch = driver().launch

    def allow_smem(self, smem: int) -> None:
        """Let launches use `smem` bytes of dynamic shared memory (above 48 KiB it must be asked for)."""
        if smem > 48 * 1024 and smem > self._smem_set:
            driver().function_set_max_dynamic_smem(self.function, smem)
            self._smem_set = smem

    def launch(self, grid: int | tuple, block: int, params: bytes, stream: int, smem: int = 0,
               cooperative: bool = False, programmatic: bool = False) -> None:
        g = (grid, 1, 1) if type(grid) is int else tuple(grid)
        if smem > 48 * 1024 and smem > self._smem_set:
            self.allow_smem(smem)
        self._launch(self.device, self.function, g, (block, 1, 1), smem, stream, params, cooperative, programmatic)


_modules: dict[tuple, int] = {}
_kernels: dict[tuple, Kernel] = {}
_lock = threading.Lock()


def device_arch(device: int) -> str:
    forced = env.get("UCCL_EP_CUDA_ARCH")
    if forced:
        return forced
    drv = driver()
    if drv.runtime_name() == "hip":
        return jit.arch_for_gcn(torch.cuda.get_device_properties(device).gcnArchName)
    return jit.arch_for_capability(drv.device_attribute(device, drv.ATTR_CC_MAJOR),
                                   drv.device_attribute(device, drv.ATTR_CC_MINOR))


def warp_size() -> int:
    """Threads per warp of the GPU runtime torch uses (the one `driver()` binds): 64 (an AMD wavefront)
    under HIP, 32 under CUDA. Block sizes counted in warps (the HT kernels' warps per peer) scale by
    it: arch.cuh's kWarpSize."""
    return 64 if torch_gpu_runtime() == "hip" else 32


def sm_number(arch: str) -> int:
    """Compute capability x 10 of an nvcc arch name (sm_90a -> 90); 0 for others (gfx*)."""
    m = re.match(r"sm_(\d+)", arch)
    return int(m.group(1)) if m else 0


def load_kernel(device: int, source: str, name: str, defines: tuple[str, ...] = ()) -> Kernel:
    """Compile (cached) core/kernels/<source> for the device and return kernel ``name``;
    ``defines`` are extra ``-D`` macros (a separate cached variant each)."""
    arch = device_arch(device)
    with _lock:
        k = _kernels.get((device, source, name, defines))
        if k is not None:
            return k
        mod = _modules.get((device, source, arch, defines))
        if mod is None:
            image = jit.compile_cubin(source, arch, extra_flags=[f"-D{d}" for d in defines])
            mod = driver().module_load(device, image.read_bytes())
            _modules[(device, source, arch, defines)] = mod
        k = Kernel(device, driver().module_function(mod, name), name)
        _kernels[(device, source, name, defines)] = k
        return k


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def tensor_ptr(t) -> int:
    """A tensor's data address, or 0 for None (an optional kernel argument)."""
    return t.data_ptr() if t is not None else 0


def dispatch_outputs(rows: int, x: torch.Tensor, x_scales, topk_idx) -> tuple:
    """Empty outputs of a normal-mode dispatch of ``rows`` rows on x's device, as DeepEP returns
    them: (recv_x, recv_x_scales or None, recv_topk_idx or None, recv_topk_weights (fp32) or None,
    recv_src_idx (int32)). Torch's caching allocator, so streams and CUDA graphs keep working."""
    dev = x.device
    K = topk_idx.shape[1] if topk_idx is not None else 0
    return (torch.empty(rows, x.shape[1], dtype=x.dtype, device=dev),
            torch.empty(rows, x_scales.shape[1], dtype=x_scales.dtype, device=dev) if x_scales is not None else None,
            torch.empty(rows, K, dtype=topk_idx.dtype, device=dev) if topk_idx is not None else None,
            torch.empty(rows, K, dtype=torch.float32, device=dev) if topk_idx is not None else None,
            torch.empty(rows, dtype=torch.int32, device=dev))


def contiguous(*tensors) -> tuple:
    """Each tensor made contiguous (a view where it already is), None left as None."""
    return tuple([t.contiguous() if t is not None else None for t in tensors])  # a list: no generator per call


def current_stream(device: int | None = None) -> int:
    """torch's current CUDA stream (a CUstream as int) of ``device`` (default: the current device).
    NOTES: torch's raw accessor where it exists: building a torch.cuda.Stream object costs
    microseconds on every launch's host path, and so does asking for the current device (engines
    pass their own)."""
    if _raw_stream is not None:
        return int(_raw_stream(torch.cuda.current_device() if device is None else device))
    return torch.cuda.current_stream(device).cuda_stream


# ---- memory ---------------------------------------------------------------------------------------
class _CudaArray:
    """Minimal __cuda_array_interface__ provider so torch can view driver-allocated memory."""

    def __init__(self, ptr: int, nbytes: int, owner: object) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}
        self._owner = owner


def raw_tensor(ptr: int, nbytes: int, device: int, owner: object) -> torch.Tensor:
    """A 1-D uint8 torch view of [ptr, ptr + nbytes) that keeps ``owner`` alive."""
    return torch.as_tensor(_CudaArray(ptr, nbytes, owner), device=torch.device("cuda", device))


class DeviceMemory:
    """cuMemAlloc'ed device memory that can be shared with same-host peers through IPC handles."""

    def __init__(self, device: int, nbytes: int) -> None:
        self.device, self.nbytes = device, nbytes
        self.ptr = driver().mem_alloc(device, max(nbytes, 1))
        self._peers: list[int] = []

    def ipc_handle(self) -> bytes:
        return driver().ipc_get_handle(self.device, self.ptr)

    def open_peer(self, handle: bytes) -> int:
        ptr = driver().ipc_open_handle(self.device, handle)
        self._peers.append(ptr)
        return ptr

    def tensor(self) -> torch.Tensor:
        return raw_tensor(self.ptr, self.nbytes, self.device, self)

    def free(self) -> None:
        if self.ptr:
            drv = driver()
            for p in self._peers:
                try:
                    drv.ipc_close_handle(self.device, p)
                except UcclEpError:
                    # NOTES: a peer's memory whose process is gone may refuse to close; this rank's
                    # own allocation below must be freed all the same (recovery after a failed peer).
                    pass
            self._peers.clear()
            ptr, self.ptr = self.ptr, 0
            drv.mem_free(self.device, ptr)


class MappedHostMemory:
    """Zeroed pinned host memory mapped into the device (error words, CPU-visible counters)."""

    def __init__(self, device: int, nbytes: int) -> None:
        self.device, self.nbytes = device, nbytes
        self.host_ptr, self.dev_ptr = driver().host_alloc_mapped(device, nbytes)
        # NOTES: one ctypes view of the whole page, made once: every op reads the error word (twice
        # per eager LL op) and a from_address per read cost a microsecond each.
        self._words = (ctypes.c_int32 * (nbytes // 4)).from_address(self.host_ptr)

    def int32(self, index: int) -> int:
        if not 0 <= index < len(self._words) or not self.host_ptr:
            raise IndexError(f"int32 word {index} of a {self.nbytes}-byte mapped page{'' if self.host_ptr else ' (freed)'}")
        return self._words[index]

    def set_int32(self, index: int, value: int) -> None:
        if not 0 <= index < len(self._words) or not self.host_ptr:
            raise IndexError(f"int32 word {index} of a {self.nbytes}-byte mapped page{'' if self.host_ptr else ' (freed)'}")
        self._words[index] = value

    def int32_array(self, index: int, count: int) -> list[int]:
        return list((ctypes.c_int32 * count).from_address(self.host_ptr + 4 * index))

    def free(self) -> None:
        if self.host_ptr:
            ptr, self.host_ptr = self.host_ptr, 0
            driver().host_free(self.device, ptr)


def free_after_device(device: int, *memories) -> None:
    """Wait for `device` to finish (a failed context is no reason to keep the memory: its error is
    ignored), then free each of `memories` that is not None (DeviceMemory, MappedHostMemory)."""
    try:
        torch.cuda.synchronize(device)
    except RuntimeError:
        pass
    for memory in memories:
        if memory is not None:
            memory.free()
