"""Compile the default HT kernels of every tuning configuration in parallel (run_device.sh `tune`),
so each benchmark run finds its kernels in the JIT cache instead of compiling on the clock.

Usage: python core/tests/gpu/precompile_ht.py RANKS "label:warps[/combine warps]:DEFINES;..."
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import torch

from uccl_ep.cuda import ht_variants, jit, runtime


def main(argv: list[str]) -> int:
    ranks, configs = int(argv[1]), [c for c in argv[2].split(";") if c.strip()]
    arch = runtime.device_arch(0) if torch.cuda.is_available() else "sm_90a"
    v = ht_variants.VARIANTS["default"]
    jobs = []
    for cfg in configs:
        _label, warps, defines = (cfg.split(":", 2) + [""])[:3]
        dw, _, cw = warps.partition("/")  # dispatch warps [/ combine warps]
        d_defs = ht_variants.default_defines(ranks, int(dw) // ranks * ranks * 32, defines)[0]
        c_defs = ht_variants.default_defines(ranks, int(cw or dw) // ranks * ranks * 32, defines)[1]
        jobs += [(v.dispatch[0], d_defs), (v.combine[0], c_defs)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for (src, defs), path in zip(jobs, pool.map(
                lambda j: jit.compile_cubin(j[0], arch, extra_flags=[f"-D{d}" for d in j[1]]), jobs)):
            print(f"  built {src} {' '.join(defs)} -> {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
