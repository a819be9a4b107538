"""Compile kernel sources for this machine's GPU in parallel, so tests and benchmarks find them in
the JIT cache instead of compiling on the clock (one nvcc per source at a time otherwise).

Usage: python tools/lab/precompile.py SOURCE.cu [SOURCE.cu ...]   (names under core/kernels)
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import torch

from uccl_ep.cuda import jit, runtime


def main(sources: list[str]) -> int:
    arch = runtime.device_arch(0) if torch.cuda.is_available() else "sm_90a"
    with ThreadPoolExecutor(max_workers=16) as pool:
        for src, path in zip(sources, pool.map(lambda s: jit.compile_cubin(s, arch), sources)):
            print(f"  built {src} -> {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
