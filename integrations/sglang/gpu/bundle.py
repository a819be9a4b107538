"""Build the offline bundle that brings SGLang's or vLLM's Python modules to the GPU machine
(Python 3.12, torch 2.11 + CUDA 13, no internet, carried files <= 64 MiB in all).

    .venv/bin/python integrations/sglang/gpu/bundle.py sglang   # -> .venv-sglang/gpu-bundle.tar.xz
    .venv/bin/python integrations/sglang/gpu/bundle.py vllm     # -> .venv-vllm/gpu-bundle.tar.xz

What goes in: the framework's own wheel reduced to its .py files (its compiled parts are CUDA
kernels these checks do not call; dropping them is what makes it fit), and cp312 wheels, --no-deps,
of the pinned CPU-test dependency list (integrations/<fw>/ci-requirements.txt) minus what the GPU
machine has (torch) or the checks do not need. On the GPU machine `site/` is put on PYTHONPATH
after `pip install --no-index --no-deps --target site wheels/*.whl` (see gpu/README.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
_PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
              "linux_x86_64")
# Not carried: provided by the GPU machine (torch), a CUDA-build DeepEP we replace, a speed-up
# transformers uses only for hub downloads, or imports that only CLI/front-end paths make.
_SKIP = {"sglang": {"sgl-deep-ep", "hf-xet"}, "vllm": {"hf-xet", "llguidance", "xgrammar", "uvloop"}}


def _python_only(wheel: Path, dest: Path, package: str) -> None:
    """Unpack only `package`'s .py/.json files and the dist-info of `wheel` into `dest`."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            top = name.split("/", 1)[0]
            if (top == package and name.endswith((".py", ".json"))) or top.endswith(".dist-info"):
                z.extract(name, dest)


def build(framework: str) -> Path:
    req = REPO / "integrations" / framework / "ci-requirements.txt"
    out = REPO / f".venv-{framework}" / "gpu-bundle"
    shutil.rmtree(out, ignore_errors=True)
    (out / "wheels").mkdir(parents=True)
    pins = [l.strip() for l in req.read_text().splitlines() if l.strip() and not l.startswith("#")]
    wanted = [p for p in pins if p.split("==")[0].lower() not in _SKIP[framework]]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none", "-d",
           str(out / "wheels")]
    for plat in _PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run(cmd + wanted, check=True)
    fw_wheel = next((out / "wheels").glob(f"{framework}-*.whl"))
    _python_only(fw_wheel, out / "site", framework)
    fw_wheel.unlink()
    # NOTES: the carry limit counts bytes as carried, so one xz tarball (the .py tree compresses ~8x);
    # the GPU-side command unpacks it first.
    tarball = out.parent / "gpu-bundle.tar.xz"
    subprocess.run(["tar", "-C", str(out.parent), "-cJf", str(tarball), "gpu-bundle"], check=True)
    shutil.rmtree(out)
    print(f"{tarball.relative_to(REPO)}: {tarball.stat().st_size / 2**20:.1f} MiB "
          f"(cp312 wheels + {framework} .py files)")
    return tarball


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in _SKIP:
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} sglang|vllm")
    build(sys.argv[1])
