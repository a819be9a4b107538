"""The AMDGPU toolchain of the CPU tests: Debian's clang 22 (AMDGPU backend: gfx90a, gfx942, gfx950)
with Debian's HIP 5.2 headers and ROCm device libraries (ci/setup.d/20-gpu-toolchain.sh installs
them). Used by test_kernels_compile.py and, through `hipcc_wrapper`, by the JIT in
test_hip_runtime_loader.py. On an AMD machine ROCm's own hipcc replaces all of this.

NOTES: two gaps between clang 22 and the 5.2 headers/libraries, closed by flags, never by source
edits: the headers read `__AMDGCN_WAVEFRONT_SIZE`, which clang 22 no longer predefines (64 on every
gfx9 target), and the device libraries have no ISA-version file for gfx942/gfx950, so they are
linked one by one (the ISA-version constant is not referenced by what the kernels use) at the code
object version they were built for (5, as ROCm 6 uses)."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

CLANG = "clang-22"
BITCODE = Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")
TARGETS = {"gfx90a": 0x3F, "gfx942": 0x4C, "gfx950": 0x4F}  # offload arch -> EF_AMDGPU_MACH in the ELF header


def clang() -> str | None:
    path = shutil.which(CLANG)
    return path if path and BITCODE.is_dir() and Path("/usr/include/hip/hip_runtime.h").is_file() else None


def compat_flags() -> list[str]:
    flags = ["-nogpulib", "-mcode-object-version=5", "-D__AMDGCN_WAVEFRONT_SIZE=64"]
    for lib in ("hip", "ockl", "ocml", "oclc_abi_version_500"):
        flags += ["-Xclang", "-mlink-builtin-bitcode", "-Xclang", str(BITCODE / f"{lib}.bc")]
    return flags


def hipcc_wrapper(directory: Path) -> Path:
    """An executable `hipcc` in `directory` that runs clang 22 with `compat_flags()` (what UCCL_EP_HIPCC
    may name: the JIT passes clang's own HIP flags)."""
    path = directory / "hipcc"
    directory.mkdir(parents=True, exist_ok=True)
    flags = " ".join(f"'{f}'" for f in compat_flags())
    path.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then exec {clang()} --version; fi\n'
                    f'exec {clang()} {flags} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def elf_mach(image: bytes) -> int:
    """EF_AMDGPU_MACH of an AMDGPU code object (the low byte of Elf64_Ehdr.e_flags); -1 if not ELF."""
    if image[:4] != b"\x7fELF" or image[18:20] != (224).to_bytes(2, "little"):  # e_machine EM_AMDGPU
        return -1
    return int.from_bytes(image[48:52], "little") & 0xFF
