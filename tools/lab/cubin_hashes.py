"""sha256 of the sm_90a cubin of every kernel source of a tree, for the -D sets the engines build
with, so two trees can be compared for a change that must not alter device code (comments, moves,
code moved into shared inline helpers). No GPU needed: the PyPI nvcc of the venv compiles; with
--arch gfx942 (or gfx90a, gfx950) the AMDGPU code object, by ROCm's hipcc or else the CPU tests'
clang 22 with Debian's HIP headers.

Usage (repo root): python tools/lab/cubin_hashes.py TREE OUT.sha [--lineinfo] [--arch ARCH] [--jobs N]
  then: diff BEFORE.sha AFTER.sha     (a tree of a commit: git archive REV | tar -x -C DIR)
Sources are keyed by their path under core/kernels ("ll/proxy/dispatch.cu"); to compare across a
move, rename the keys of one file first.

The tree's core/kernels is copied to one fixed path before compiling, so nothing path-dependent
differs between trees. Without --lineinfo (the default) the whole cubin is compared; the JIT adds
-lineinfo, whose line tables move with any comment line, so with it only the debug sections may
differ (compare the .text sections then).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def jobs(kernel_dir: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Every source without -D, plus the -D sets of the engines (HT block size and group size, the
    profiling and register-pipeline builds, the LL proxy parts experiment, LogFMT combine)."""
    out = [(src, ()) for src in sorted(p.relative_to(kernel_dir).as_posix() for p in kernel_dir.rglob("*.cu"))]
    for ranks in (2, 4, 8):
        threads = 16 // ranks * ranks * 32
        out.append(("ht/nvlink/dispatch.cu", (f"UCCL_EP_HT_THREADS={threads}",)))
        for src in ("ht/nvlink/combine.cu", "ht/nvlink/combine_ce.cu", "ht/nvlink/dispatch_ce.cu"):
            out.append((src, (f"UCCL_EP_RANKS={ranks}", f"UCCL_EP_HT_THREADS={threads}")))
    out += [("ht/nvlink/combine.cu", ("UCCL_EP_RANKS=2", "UCCL_EP_HT_THREADS=512", "UCCL_EP_HT_PROF=1")),
            ("ht/nvlink/dispatch.cu", ("UCCL_EP_HT_THREADS=512", "UCCL_EP_HT_PROF=1")),
            ("ht/nvlink/combine.cu", ("UCCL_EP_RANKS=2", "UCCL_EP_HT_THREADS=512", "UCCL_EP_HT_COMBINE_STAGES=0"))]
    out += [(src, ("UCCL_EP_LL_PARTS=2",)) for src in ("ll/proxy/dispatch.cu", "ll/proxy/combine.cu")]
    out += [(src, ("UCCL_EP_LL_LOGFMT=1",)) for src in ("ll/nvlink/combine.cu", "ll/proxy/combine.cu")]  # use_logfmt
    return [j for j in dict.fromkeys(out) if (kernel_dir / j[0]).is_file()]


def _hip_compiler(jit) -> list[str]:
    """ROCm's hipcc where there is one, else the CPU tests' clang 22 with Debian's HIP headers."""
    try:
        return [str(jit.find_hipcc())]
    except Exception:  # noqa: BLE001 - no ROCm here: the CPU tests' toolchain
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "core" / "tests" / "cpu"))
        import hip_toolchain
        if hip_toolchain.clang() is None:
            raise SystemExit("neither ROCm's hipcc nor clang-22 with the HIP headers (ci/setup.d/20-gpu-toolchain.sh)")
        return [hip_toolchain.clang(), *hip_toolchain.compat_flags()]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tree", type=Path, help="repository root whose core/kernels to compile")
    p.add_argument("out", type=Path, help="file for the '<sha256>  <source>[.<defines>]' lines")
    p.add_argument("--lineinfo", action="store_true", help="compile with -lineinfo, as the JIT does")
    p.add_argument("--arch", default="sm_90a", help="sm_90a (nvcc), or an AMD arch: gfx90a, gfx942, gfx950")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    from uccl_ep.cuda import jit
    compiler = _hip_compiler(jit) if jit.is_hip_arch(args.arch) else [str(jit.find_nvcc())]
    # NOTES: one fixed path for every tree (and run), so that no path can make two builds differ
    tmp = Path(tempfile.gettempdir()) / "uccl-ep-cubin-hashes"
    shutil.rmtree(tmp, ignore_errors=True)
    fixed = tmp / "kernels"
    shutil.copytree(args.tree / "core" / "kernels", fixed)

    def build(job):
        src, defs = job
        name = src + ("." + ".".join(defs) if defs else "")
        out = Path(tmp) / f"{name.replace('/', '_')}.cubin"
        if jit.is_hip_arch(args.arch):
            cmd = [*compiler, "-x", "hip", "-std=c++17", "-O3", *(["-g"] if args.lineinfo else []),
                   f"--offload-arch={args.arch}", "--cuda-device-only", "-S"]  # assembly: no lld here
        else:
            cmd = [*compiler, "-std=c++17", "-O3", *(["-lineinfo"] if args.lineinfo else []), "--cubin",
                   f"-arch={args.arch}"]
        cmd += ["-DNDEBUG", f"-I{fixed / 'include'}", *(f"-D{d}" for d in defs), str(fixed / src), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if res.returncode:
            return name, "FAILED " + res.stderr[-400:].replace("\n", " | ")
        return name, hashlib.sha256(out.read_bytes()).hexdigest()

    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            results = sorted(pool.map(build, jobs(fixed)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.write_text("".join(f"{h}  {n}\n" for n, h in results))
    failed = [n for n, h in results if h.startswith("FAILED")]
    print(f"{len(results)} {args.arch} builds -> {args.out}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
