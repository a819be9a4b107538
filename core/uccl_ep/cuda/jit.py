"""JIT compilation of uccl_ep's CUDA kernels (core/kernels/*.cu, shipped as package data).

Contract:
- nvcc is found through ``UCCL_EP_NVCC``, then ``$CUDA_HOME/bin/nvcc``, then ``nvcc`` on PATH,
  then the ``nvidia-cuda-nvcc`` pip package; when none exists, `MissingDependency` says what to
  install;
- the target arch comes from ``UCCL_EP_CUDA_ARCH`` or the device (9.0 -> sm_90a, 10.0 -> sm_100a);
- a compiled cubin is cached under ``UCCL_EP_JIT_CACHE_DIR`` by a key that hashes the source,
  every header it includes (recursively, by content), the flags, the arch and nvcc's version;
- a result is published by an atomic rename of a fully written, fsync'ed temporary file, so ranks
  racing on a shared file system all end up loading one complete cubin; a per-key lock file
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

__all__ = ["kernel_dir", "include_dir", "find_nvcc", "nvcc_version", "include_closure", "cache_key",
           "compile_cubin", "default_flags", "arch_for_capability"]

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)
_NVCC_HINT = ("install nvcc (pip install nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm nvidia-cuda-cccl "
              "nvidia-cuda-runtime, matching your driver's CUDA major version), or set UCCL_EP_NVCC / CUDA_HOME")


def kernel_dir() -> Path:
    """core/kernels in a source tree (editable installs pick up edits), else the package data."""
    here = Path(__file__).resolve()
    for cand in (here.parents[2] / "kernels", here.parents[1] / "kernels"):
        if (cand / "include" / "uccl_ep").is_dir():
            return cand
    raise MissingDependency(f"uccl_ep kernel sources not found next to {here.parents[1]} (broken install?)")


def include_dir() -> Path:
    return kernel_dir() / "include"


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


@functools.lru_cache(maxsize=8)
def _nvcc_version_cached(path: str, mtime_ns: int) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise MissingDependency(f"nvcc at {path} does not run ({e}); {_NVCC_HINT}") from None
    if out.returncode != 0:
        raise MissingDependency(f"nvcc at {path} failed: {out.stderr.strip()[:500]}; {_NVCC_HINT}")
    return out.stdout.strip()


def nvcc_version(nvcc: Path) -> str:
    return _nvcc_version_cached(str(nvcc), nvcc.stat().st_mtime_ns)


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
    h.update(source.name.encode() + b"\0" + source.read_bytes())
    for hdr in headers:
        h.update(b"\0" + hdr.name.encode() + b"\0" + hdr.read_bytes())
    return h.hexdigest()[:32]


def arch_for_capability(major: int, minor: int) -> str:
    # NOTES: the 'a' targets unlock Hopper/Blackwell-only instructions; the cubin only runs on
    # that exact capability, which is what a JIT for the device at hand wants.
    if (major, minor) in ((9, 0), (10, 0), (10, 3), (12, 0)):
        return f"sm_{major}{minor}a"
    return f"sm_{major}{minor}"


def default_flags(arch: str) -> list[str]:
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
    """Compile core/kernels/<source_name> for ``arch`` (cached); return the cubin path."""
    source = kernel_dir() / source_name
    if not source.is_file():
        raise MissingDependency(f"kernel source {source} is missing (broken install?)")
    nvcc = nvcc or find_nvcc()
    inc = include_dir()
    flags = default_flags(arch) + [f"-I{inc}"] + list(extra_flags)
    key = cache_key(source, include_closure(source, [inc]), [f for f in flags if not f.startswith("-I")], arch,
                    nvcc_version(nvcc))
    cache = cache_dir or _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{source.stem}-{arch}-{key}.cubin"
    if out.is_file():
        return out
    fd = _lock(cache / f".{out.name}.lock", timeout_s)
    try:
        if out.is_file():  # a racing rank published it while we waited
            return out
        with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmp:
            tmp_out = Path(tmp) / out.name
            cmd = [str(nvcc), *flags, str(source), "-o", str(tmp_out)]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise MissingDependency(f"nvcc did not finish {source_name} in {timeout_s:.0f}s: {' '.join(cmd)}") \
                    from None
            if res.returncode != 0 or not tmp_out.is_file():
                raise RuntimeError(f"nvcc failed on {source_name} ({' '.join(cmd)}):\n{res.stderr[-4000:]}")
            with open(tmp_out, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp_out, out)  # atomic publish
        return out
    finally:
        if fd is not None:
            os.close(fd)
