"""JIT compilation of uccl_ep's kernels (core/kernels/**/*.cu, shipped as package data) for NVIDIA
(nvcc -> cubin) and AMD (hipcc or clang -> HIP code object).

A kernel source is named by its path under core/kernels ("ll/proxy/dispatch.cu"): the name
`load_kernel` and `compile_cubin` take, part of the cache key and of the cached file's name.

Contract:
- nvcc is found through ``UCCL_EP_NVCC``, then ``$CUDA_HOME/bin/nvcc``, then ``nvcc`` on PATH,
  then the ``nvidia-cuda-nvcc`` pip package; hipcc through ``UCCL_EP_HIPCC``, then
  ``$ROCM_PATH/bin/hipcc`` (``$HIP_PATH``, ``/opt/rocm``), then ``hipcc`` on PATH. When none
  exists, `MissingDependency` says what to install;
- the target arch comes from ``UCCL_EP_CUDA_ARCH`` or the device (9.0 -> sm_90a, 10.0 -> sm_100a;
  an AMD device's gfx name, e.g. gfx942, without its sramecc/xnack features);
- a compiled code object is cached under ``UCCL_EP_JIT_CACHE_DIR`` by a key that hashes the
  source, every header it includes (recursively, by content), the flags, the arch and the
  compiler's version;
- a result is published by an atomic rename of a fully written, fsync'ed temporary file, so ranks
  racing on a shared file system all end up loading one complete code object; a per-key lock file
  (bounded wait) keeps them from compiling the same thing twice.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

from .. import env
from ..errors import MissingDependency

__all__ = ["kernel_dir", "include_dir", "kernel_sources", "relative_source", "find_nvcc", "find_hipcc", "find_compiler",
           "compiler_version", "nvcc_version", "include_closure", "cache_key", "compile_cubin", "default_flags", "arch_for_capability", "arch_for_gcn",
           "is_hip_arch"]

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)
_NVCC_HINT = ("install nvcc (pip install nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm nvidia-cuda-cccl "
              "nvidia-cuda-runtime, matching your driver's CUDA major version), or set UCCL_EP_NVCC / CUDA_HOME")


_HIPCC_HINT = ("install ROCm 6.0+ (its hipcc; the rocm/pytorch images have it), or set UCCL_EP_HIPCC to hipcc or "
               "to a clang with the AMDGPU backend and HIP headers")


def kernel_dir() -> Path:
    """core/kernels in a source tree (editable installs pick up edits), else the package data."""
    here = Path(__file__).resolve()
    for cand in (here.parents[2] / "kernels", here.parents[1] / "kernels"):
        if (cand / "include" / "uccl_ep").is_dir():
            return cand
    raise MissingDependency(f"uccl_ep kernel sources not found next to {here.parents[1]} (broken install?)")


def include_dir() -> Path:
    return kernel_dir() / "include"


def kernel_sources() -> list[str]:
    """Every kernel source, by its name under core/kernels (posix path, sorted)."""
    root = kernel_dir()
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.cu"))


def relative_source(source: Path) -> str:
    """The path of `source` under core/kernels ("ht/nvlink/dispatch.cu"); its file name when it
    lies elsewhere (a test's copy of the tree)."""
    try:
        return source.resolve().relative_to(kernel_dir().resolve()).as_posix()
    except (ValueError, MissingDependency):
        return source.name


def _source_path(name: str) -> Path:
    """core/kernels/<name>; a name that leaves core/kernels is refused."""
    root = kernel_dir()
    path = (root / name).resolve()
    if Path(name).is_absolute() or not path.is_relative_to(root.resolve()):
        raise ValueError(f"kernel source {name!r}: expected a path under {root} (e.g. 'll/proxy/dispatch.cu')")
    return path


def _nvcc_candidates() -> list[tuple[str, Path]]:
    cands: list[tuple[str, Path]] = []
    explicit = env.get("UCCL_EP_NVCC")
    if explicit:
        cands.append(("UCCL_EP_NVCC", Path(explicit)))
        return cands
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        cands.append(("CUDA_HOME", Path(cuda_home) / "bin" / "nvcc"))
    which = shutil.which("nvcc")
    if which:
        cands.append(("PATH", Path(which)))
    try:
        import nvidia  # namespace package of NVIDIA's wheels
        for root in getattr(nvidia, "__path__", []):
            for sub in ("cu13", "cu12", "cuda_nvcc"):
                cands.append(("nvidia-cuda-nvcc", Path(root) / sub / "bin" / "nvcc"))
    except ImportError:
        pass
    return cands


def find_nvcc() -> Path:
    """The nvcc to use, or `MissingDependency` naming every place looked at."""
    tried = []
    for source, path in _nvcc_candidates():
        if path.is_file() and os.access(path, os.X_OK):
            return path
        tried.append(f"{source}: {path}")
    where = "; ".join(tried) if tried else "no UCCL_EP_NVCC, CUDA_HOME, nvcc on PATH or nvidia-cuda-nvcc package"
    raise MissingDependency(f"uccl_ep's CUDA kernels need nvcc at first use and none was found ({where}); {_NVCC_HINT}")


def _hipcc_candidates() -> list[tuple[str, Path]]:
    explicit = env.get("UCCL_EP_HIPCC")
    if explicit:
        return [("UCCL_EP_HIPCC", Path(explicit))]
    cands: list[tuple[str, Path]] = []
    for var in ("ROCM_PATH", "HIP_PATH"):
        if os.environ.get(var):
            cands.append((var, Path(os.environ[var]) / "bin" / "hipcc"))
    cands.append(("/opt/rocm", Path("/opt/rocm/bin/hipcc")))
    which = shutil.which("hipcc")
    if which:
        cands.append(("PATH", Path(which)))
    return cands


def find_hipcc() -> Path:
    """The HIP compiler to use, or `MissingDependency` naming every place looked at."""
    tried = []
    for source, path in _hipcc_candidates():
        if path.is_file() and os.access(path, os.X_OK):
            return path
        tried.append(f"{source}: {path}")
    raise MissingDependency(f"uccl_ep's HIP kernels need hipcc at first use and none was found ({'; '.join(tried)}); "
                            f"{_HIPCC_HINT}")


def is_hip_arch(arch: str) -> bool:
    return arch.startswith("gfx")


def find_compiler(arch: str) -> Path:
    """hipcc for a gfx target, nvcc otherwise."""
    return find_hipcc() if is_hip_arch(arch) else find_nvcc()


@functools.lru_cache(maxsize=8)
def _version_cached(path: str, mtime_ns: int) -> str:
    hint = _HIPCC_HINT if "hip" in Path(path).name or "clang" in Path(path).name else _NVCC_HINT
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise MissingDependency(f"compiler at {path} does not run ({e}); {hint}") from None
    if out.returncode != 0:
        raise MissingDependency(f"compiler at {path} failed: {out.stderr.strip()[:500]}; {hint}")
    return out.stdout.strip()


def compiler_version(compiler: Path) -> str:
    """`compiler --version` (cached per path and modification time): part of every cache key."""
    return _version_cached(str(compiler), compiler.stat().st_mtime_ns)


nvcc_version = compiler_version


def include_closure(source: Path, include_dirs: Sequence[Path]) -> list[Path]:
    """Every project header `source` includes, recursively (system headers are covered by nvcc's
    version). Sorted, deduplicated, resolved paths."""
    seen: set[Path] = set()
    stack = [source.resolve()]
    while stack:
        cur = stack.pop()
        try:
            text = cur.read_text()
        except OSError:
            continue
        for name in _INCLUDE_RE.findall(text):
            for base in (cur.parent, *include_dirs):
                cand = (base / name).resolve()
                if cand.is_file():
                    if cand not in seen:
                        seen.add(cand)
                        stack.append(cand)
                    break
    return sorted(seen)


def cache_key(source: Path, headers: Iterable[Path], flags: Sequence[str], arch: str, version: str) -> str:
    h = hashlib.sha256()
    for part in ("uccl_ep-jit-v1", arch, version, "\0".join(flags)):
        h.update(part.encode())
        h.update(b"\0")
    h.update(relative_source(source).encode() + b"\0" + source.read_bytes())
    for hdr in headers:
        h.update(b"\0" + hdr.name.encode() + b"\0" + hdr.read_bytes())
    return h.hexdigest()[:32]


def arch_for_capability(major: int, minor: int) -> str:
    # NOTES: the 'a' targets unlock Hopper/Blackwell-only instructions; the cubin only runs on
    # that exact capability, which is what a JIT for the device at hand wants.
    if (major, minor) in ((9, 0), (10, 0), (10, 3), (12, 0)):
        return f"sm_{major}{minor}a"
    return f"sm_{major}{minor}"


def arch_for_gcn(gcn_arch_name: str) -> str:
    """The offload target of an AMD device from its gcnArchName ("gfx942:sramecc+:xnack-" -> "gfx942").

    NOTES: a code object built without target features loads whatever the device's sramecc / xnack
    modes are, so one cache entry serves every MI300X."""
    arch = gcn_arch_name.split(":", 1)[0].strip()
    if not re.fullmatch(r"gfx[0-9a-f]+", arch):
        raise MissingDependency(f"unrecognised AMD GPU arch name {gcn_arch_name!r}; set UCCL_EP_CUDA_ARCH (e.g. gfx942)")
    return arch


def default_flags(arch: str) -> list[str]:
    if is_hip_arch(arch):
        # NOTES: device-only, unbundled: the output is the ELF code object hipModuleLoadData takes.
        return ["-std=c++17", "-O3", "-x", "hip", f"--offload-arch={arch}", "--offload-device-only",
                "--no-gpu-bundle-output", "-DNDEBUG"]
    return ["-std=c++17", "-O3", "-lineinfo", "--cubin", f"-arch={arch}", "-DNDEBUG"]


def _cache_dir() -> Path:
    d = Path(os.path.expanduser(env.get("UCCL_EP_JIT_CACHE_DIR")))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _lock(path: Path, timeout_s: float):
    """Best-effort exclusive lock file; returns the fd (or None if the wait timed out)."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                return None
            if time.monotonic() > deadline:
                # NOTES: a stuck peer must not hang us; compiling twice is harmless (atomic rename).
                os.close(fd)
                return None
            time.sleep(0.05)


def compile_cubin(source_name: str, arch: str, extra_flags: Sequence[str] = (), nvcc: Path | None = None,
                  cache_dir: Path | None = None, timeout_s: float = 600.0) -> Path:
    """Compile core/kernels/<source_name> (a path under it, e.g. "ll/nvlink/combine.cu") for ``arch``
    (cached); return the code object's path: a cubin for sm_*, a HIP code object (.hsaco) for gfx*.
    ``nvcc``: the compiler to use (hipcc or clang for a gfx target); default `find_compiler(arch)`."""
    source = _source_path(source_name)
    if not source.is_file():
        raise MissingDependency(f"kernel source {source} is missing (broken install?)")
    compiler = nvcc or find_compiler(arch)
    inc = include_dir()
    flags = default_flags(arch) + [f"-I{inc}"] + list(extra_flags)
    key = cache_key(source, include_closure(source, [inc]), [f for f in flags if not f.startswith("-I")], arch,
                    compiler_version(compiler))
    cache = cache_dir or _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    # NOTES: the folders are part of the file name (ll/proxy/dispatch.cu -> ll_proxy_dispatch-...),
    # so sources of one name in two folders stay apart and readable in the cache
    flat = source_name.removesuffix(".cu").replace("/", "_")
    out = cache / f"{flat}-{arch}-{key}.{'hsaco' if is_hip_arch(arch) else 'cubin'}"
    if out.is_file():
        return out
    fd = _lock(cache / f".{out.name}.lock", timeout_s)
    try:
        if out.is_file():  # a racing rank published it while we waited
            return out
        with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmp:
            tmp_out = Path(tmp) / out.name
            cmd = [str(compiler), *flags, str(source), "-o", str(tmp_out)]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise MissingDependency(f"{compiler.name} did not finish {source_name} in {timeout_s:.0f}s: "
                                        f"{' '.join(cmd)}") from None
            if res.returncode != 0 or not tmp_out.is_file():
                raise RuntimeError(f"{compiler.name} failed on {source_name} ({' '.join(cmd)}):\n{res.stderr[-4000:]}")
            with open(tmp_out, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp_out, out)  # atomic publish
        return out
    finally:
        if fd is not None:
            os.close(fd)
