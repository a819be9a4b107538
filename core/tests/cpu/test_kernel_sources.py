"""Every kernel source a module names exists, so that moving or renaming a file under core/kernels
can never leave a dangling name: the source strings given to load_kernel / compile_cubin in
core/uccl_ep and tools/lab, and the kernel files the docs and headers point at."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from uccl_ep.cuda import jit

ROOT = Path(__file__).resolve().parents[3]
KERNELS = ROOT / "core" / "kernels"
LAB = ROOT / "tools" / "lab"
# A source path inside a string constant, e.g. "ll/proxy/dispatch.cu" (not "*.cu", not prose).
_SOURCE_CONST = re.compile(r"[\w/]+\.cu")
# A source path inside text (docs, comments): not part of a brace or glob pattern.
_SOURCE_TEXT = re.compile(r"(?<![\w/*{},.-])((?:core/)?(?:kernels/)?[\w/]+\.cu)\b")


def _python_sources(path: Path) -> list[tuple[int, str]]:
    """(line, string) of every string constant in `path` that is a kernel source name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and _SOURCE_CONST.fullmatch(n.value)]


def _exists(name: str, *roots: Path) -> bool:
    name = name.removeprefix("core/").removeprefix("kernels/")
    return any((root / name).is_file() for root in roots)


def _dangling_in_python(files, *roots: Path) -> list[str]:
    return [f"{f.name}:{line}: {name}" for f in files for line, name in _python_sources(f)
            if not _exists(name, *roots)]


def test_every_source_named_in_the_package_exists():
    files = sorted((ROOT / "core" / "uccl_ep").rglob("*.py"))
    named = {name for f in files for _, name in _python_sources(f)}
    # the scan sees the engines' sources (a scan that finds nothing would pass vacuously)
    assert {"layout.cu", "ll/nvlink/dispatch.cu", "ll/proxy/combine.cu", "ht/nvlink/notify.cu",
            "ht/proxy/forward_dispatch.cu", "transport/copy_ring.cu"} <= named
    assert not _dangling_in_python(files, KERNELS)


def test_every_source_named_by_the_lab_tools_exists():
    files = sorted(LAB.rglob("*.py"))
    assert not _dangling_in_python(files, KERNELS, LAB)
    text = (LAB / "run_device.sh").read_text()
    missing = [m for m in _SOURCE_TEXT.findall(text) if not _exists(m, KERNELS, LAB)]
    assert not missing, f"run_device.sh names missing kernel sources: {missing}"


def test_a_renamed_source_is_caught(tmp_path):
    """The scan flags a name that is not under core/kernels (what an old flat name would be)."""
    mod = tmp_path / "m.py"
    mod.write_text('load_kernel(0, "ll_dispatch_proxy.cu", "ll_dispatch_proxy_send")\n'
                   'K = (("ll/proxy/dispatch.cu", "ll_dispatch_proxy_recv"),)\n')
    assert [d.split(": ")[1] for d in _dangling_in_python([mod], KERNELS)] == ["ll_dispatch_proxy.cu"]


def test_docs_and_headers_name_existing_sources():
    files = [*sorted((ROOT / "docs").glob("*.md")), LAB / "README.md",
             *sorted((KERNELS / "include").rglob("*.h")), *sorted((KERNELS / "include").rglob("*.cuh"))]
    # (an upper-case name is a placeholder, e.g. SOURCE.cu in a usage line)
    missing = [f"{f.relative_to(ROOT)}: {m}" for f in files for m in _SOURCE_TEXT.findall(f.read_text())
               if not _exists(m, KERNELS, LAB) and not m.rpartition("/")[2].removesuffix(".cu").isupper()]
    assert not missing, "\n".join(missing)


def test_jit_takes_nested_names_and_refuses_paths_outside_the_kernels():
    assert "ll/proxy/dispatch.cu" in jit.kernel_sources()
    assert jit.relative_source(KERNELS / "ht" / "nvlink" / "dispatch.cu") == "ht/nvlink/dispatch.cu"
    for bad in ("../uccl_ep/env.py", "/etc/passwd"):
        with pytest.raises(ValueError, match="expected a path under"):
            jit.compile_cubin(bad, "sm_90a")
