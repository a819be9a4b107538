"""Every kernel compiles for sm_90a and sm_100a (PyPI nvcc) and for gfx90a (Debian's hipcc) through
the one warp/wavefront abstraction header, and the kernel parameter ABI agrees with the Python
packer. Nothing runs on a device. The toolchains come from ci/setup.d/20-gpu-toolchain.sh; where
they are absent the tests skip, except under CI, where that is a failure."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from uccl_ep.cuda import jit, runtime

KERNELS = sorted(p.name for p in jit.kernel_dir().glob("*.cu"))


def _tool_or_skip(what: str, path):
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{what} missing on CI: ci/setup.d/20-gpu-toolchain.sh should have installed it")
        pytest.skip(f"{what} not installed (ci/setup.d/20-gpu-toolchain.sh installs it)")
    return path


def _nvcc():
    try:
        return jit.find_nvcc()
    except Exception:  # noqa: BLE001
        return None


def test_kernel_set():
    assert {"ll_dispatch.cu", "ll_combine.cu", "layout.cu", "intranode_notify.cu", "intranode_dispatch.cu",
            "intranode_combine.cu"} <= set(KERNELS)


@pytest.mark.parametrize("source", KERNELS)
def test_nvcc_sm90_sm100(source, tmp_path):
    nvcc = _tool_or_skip("nvcc", _nvcc())
    cmd = [str(nvcc), "-std=c++17", "-O3", f"-I{jit.include_dir()}", "-c",
           "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_100a,code=sm_100a",
           "-DNDEBUG", str(jit.kernel_dir() / source), "-o", str(tmp_path / "k.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.parametrize("source", KERNELS)
def test_hipcc_gfx90a(source, tmp_path):
    hipcc = _tool_or_skip("hipcc", shutil.which("hipcc"))
    cmd = [hipcc, "-std=c++17", "-x", "hip", "--offload-arch=gfx90a", "-O3", f"-I{jit.include_dir()}", "-c",
           str(jit.kernel_dir() / source), "-o", str(tmp_path / "k.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def test_param_abi_sizes_match_the_packer(tmp_path):
    """sizeof(struct) == 8 x the fields Python packs, checked by a C++ compiler on the header."""
    cxx = _tool_or_skip("a C++ compiler", shutil.which("g++") or shutil.which("c++"))
    structs = ["LLDispatchParams", "LLDispatchRecvParams", "LLCombineParams", "LLCombineRecvParams",
               "HTLayoutParams", "HTNotifyParams", "HTDispatchParams", "HTCombineParams"]
    lines = ['#include "uccl_ep/kernel_abi.h"']
    for s in structs:
        n = len(runtime.param_fields(s))
        lines.append(f"static_assert(sizeof(uccl_ep::{s}) == {8 * n}, \"{s}: {n} fields\");")
    src = tmp_path / "abi.cc"
    src.write_text("\n".join(lines) + "\n")
    res = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", f"-I{jit.include_dir()}", str(src)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
