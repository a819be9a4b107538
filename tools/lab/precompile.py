"""Compile kernels for this machine's GPU in parallel into the JIT cache, so tests and benchmarks
find them there instead of compiling on the clock (one nvcc per source at a time otherwise).

Usage (repo root):
  python tools/lab/precompile.py SOURCE.cu [SOURCE.cu ...]
      the sources (paths under core/kernels, e.g. ll/proxy/dispatch.cu) as the engines without -D
      settings load them
  python tools/lab/precompile.py --ht RANKS "label:warps[/combine warps]:DEFINES;..."
      the HT dispatch and combine kernels of every tuning configuration (run_device.sh
      `tune`): block sizes from the warps, -D settings from DEFINES (Tuning.ht_defines' syntax)
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor

# (source under core/kernels, -D settings without the -D)
Job = tuple[str, tuple[str, ...]]


def ht_jobs(ranks: int, configs: str) -> list[Job]:
    """The (dispatch, combine) builds of each ``label:warps[/combine warps]:DEFINES`` item, with
    the block size the engine derives from the warps (whole warps per peer rank)."""
    from uccl_ep.cuda import ht_tuning
    jobs: list[Job] = []
    for cfg in (c for c in configs.split(";") if c.strip()):
        _label, warps, defines = (cfg.split(":", 2) + [""])[:3]
        dw, _, cw = warps.partition("/")
        d_defs = ht_tuning.kernel_defines(ranks, int(dw) // ranks * ranks * 32, defines)[0]
        c_defs = ht_tuning.kernel_defines(ranks, int(cw or dw) // ranks * ranks * 32, defines)[1]
        jobs += [(ht_tuning.DISPATCH[0], d_defs), (ht_tuning.COMBINE[0], c_defs)]
    return jobs


def build(jobs: list[Job], workers: int) -> None:
    import torch
    from uccl_ep.cuda import jit, runtime
    arch = runtime.device_arch(0) if torch.cuda.is_available() else "sm_90a"
    with ThreadPoolExecutor(max_workers=workers) as pool:
        paths = pool.map(lambda j: jit.compile_cubin(j[0], arch, extra_flags=[f"-D{d}" for d in j[1]]), jobs)
        for (src, defs), path in zip(jobs, paths):
            print(f"  built {src} {' '.join(defs)} -> {path.name}".replace("  ->", " ->"))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="precompile.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ht", nargs=2, metavar=("RANKS", "CONFIGS"), help="the default HT kernels of each configuration")
    p.add_argument("--jobs", type=int, default=16, help="compilers at once (default 16)")
    p.add_argument("sources", nargs="*", help="kernel sources, by path under core/kernels")
    args = p.parse_args(argv)
    jobs: list[Job] = [(s, ()) for s in args.sources]
    if args.ht:
        jobs += ht_jobs(int(args.ht[0]), args.ht[1])
    if not jobs:
        p.error("name kernel sources, or --ht RANKS CONFIGS")
    build(jobs, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
