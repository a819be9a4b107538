"""Which vLLM versions the plugin supports; the names it adds. Package metadata only: no vllm,
torch or CUDA import, so `plugin_status()` is cheap for `uccl-ep doctor`."""

from __future__ import annotations

import re
from importlib import metadata
from typing import Optional

__all__ = ["FLAG", "BACKENDS", "TESTED_WINDOW", "TESTED_VERSIONS", "ENTRY_POINT_GROUP", "installed_version",
           "is_tested", "window_text", "flag_set", "entry_point_registered"]

#: Set to "1" by the plugin once a `uccl_*` backend is chosen; vLLM's engine-core and worker
#: processes (started after the config exists) inherit it and put uccl_ep under vLLM's DeepEP
#: managers. Setting it by hand with `--all2all-backend deepep_*` does the same (uccl_ep.env).
FLAG = "UCCL_EP_VLLM"

#: The values `--all2all-backend` gains, and vLLM's DeepEP path each one runs through.
BACKENDS = {
    "uccl_low_latency": "deepep_low_latency",
    "uccl_high_throughput": "deepep_high_throughput",
}

ENTRY_POINT_GROUP = "vllm.general_plugins"

# NOTES: vLLM has no all2all registry; the plugin patches ParallelConfig and the CLI kwargs and
# relies on the DeepEP managers' and prepare/finalize classes' call shapes, which move between
# minor releases. The tested window is the 0.33 series (patch releases keep those shapes); CI runs
# its oldest and newest release on PyPI (ci/setup.d/41-vllm.sh: 0.33.0 is both today). Releases
# outside it run with a warning; whatever does not fit fails with a typed error where it is used.
TESTED_WINDOW = ((0, 33, 0), (0, 33, 999))
TESTED_VERSIONS = ("0.33.0",)


def installed_version() -> Optional[str]:
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version or "")
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def is_tested(version: Optional[str]) -> bool:
    """In the tested window (a local build suffix, "0.33.0+cu130", is the same release)."""
    release = _release(version or "")
    return bool(release) and TESTED_WINDOW[0] <= release[:3] <= TESTED_WINDOW[1]


def window_text() -> str:
    lo, hi = TESTED_WINDOW
    return f"{lo[0]}.{lo[1]}.x" if lo[:2] == hi[:2] else f"{'.'.join(map(str, lo))}..{'.'.join(map(str, hi))}"


def flag_set(environ=None) -> bool:
    """UCCL_EP_VLLM through uccl_ep's registry (a value that is no boolean is an InvalidArgument)."""
    from uccl_ep import env
    return bool(env.get(FLAG, environ))


def entry_point_registered() -> bool:
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # pragma: no cover - broken metadata on the path
        return False
    return any(ep.value.startswith("uccl_ep_vllm.") for ep in eps)
