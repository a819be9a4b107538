"""Kernels that only lab tools run (tools/lab/*.cu, never shipped in the package): compiled here for
the device at hand against the package's kernel tree, loaded through the package's runtime, and
their parameter structs packed from the lab source itself.

  mod = LabModule(dev, "probe_copy_ring.cu"); k = mod.kernel("ll_proxy_dma_probe")
  k.launch(grid, block, mod.pack("CopyProbeParams", dst=..., ...), stream)
"""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from pathlib import Path

LAB = Path(__file__).resolve().parent
_STRUCT_RE = re.compile(r"struct\s+(\w+)\s*\{(.*?)\};", re.S)
_FIELD_RE = re.compile(r"^\s*(u?int64_t)\s+(\w+)\s*;", re.M)


def compile_lab(source: str, arch: str) -> bytes:
    """The code object of tools/lab/<source> for ``arch`` (cubin or HIP code object); the package's
    headers and kernel sources are on the include path (a lab source may include a production one)."""
    from uccl_ep.cuda import jit
    compiler = jit.find_compiler(arch)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lab.bin"
        cmd = [str(compiler), *jit.default_flags(arch), f"-I{jit.include_dir()}", f"-I{jit.kernel_dir()}",
               str(LAB / source), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode or not out.is_file():
            raise RuntimeError(f"{compiler.name} failed on tools/lab/{source}:\n{res.stderr[-4000:]}")
        return out.read_bytes()


def param_struct(source: str, name: str) -> tuple[str, tuple[str, ...]]:
    """(struct format, field names) of parameter struct ``name`` declared in tools/lab/<source>
    (int64_t / uint64_t fields only, as in kernel_abi.h)."""
    for sname, body in _STRUCT_RE.findall((LAB / source).read_text()):
        if sname == name:
            fields = _FIELD_RE.findall(body)
            return "<" + "".join("Q" if t == "uint64_t" else "q" for t, _ in fields), tuple(f for _, f in fields)
    raise KeyError(f"no struct {name} in tools/lab/{source}")


class LabModule:
    """tools/lab/<source> compiled for and loaded on ``device``."""

    def __init__(self, device: int, source: str) -> None:
        from uccl_ep.cuda import runtime as rt
        self.device, self.source, self._rt = device, source, rt
        self._drv = rt.driver()
        self._mod = self._drv.module_load(device, compile_lab(source, rt.device_arch(device)))

    def kernel(self, name: str):
        return self._rt.Kernel(self.device, self._drv.module_function(self._mod, name), name)

    def pack(self, struct_name: str, **values: int) -> bytes:
        fmt, names = param_struct(self.source, struct_name)
        if set(values) != set(names):
            raise TypeError(f"{struct_name}: missing {[n for n in names if n not in values]}, "
                            f"unknown {sorted(set(values) - set(names))}")
        return struct.pack(fmt, *[int(values[n]) for n in names])
