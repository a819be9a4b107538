"""Which vLLM versions the plugin supports; the names it adds. Package metadata only: no vllm,
torch or CUDA import, so `plugin_status()` is cheap for `uccl-ep doctor`."""

from __future__ import annotations

import os
from importlib import metadata
from typing import Optional

__all__ = ["FLAG", "ALLOW_UNTESTED", "BACKENDS", "TESTED_VERSIONS", "ENTRY_POINT_GROUP",
           "installed_version", "is_tested", "untested_allowed", "flag_set", "entry_point_registered"]

#: Set to "1" by the plugin once a `uccl_*` backend is chosen; vLLM's engine-core and worker
#: processes (started after the config exists) inherit it and put uccl_ep under vLLM's DeepEP
#: managers. Setting it by hand with `--all2all-backend deepep_*` does the same (uccl_ep.env).
FLAG = "UCCL_EP_VLLM"
#: "1" lets the plugin run on a vLLM version it was not tested with (uccl_ep.env).
ALLOW_UNTESTED = "UCCL_EP_VLLM_ALLOW_UNTESTED"

#: The values `--all2all-backend` gains, and vLLM's DeepEP path each one runs through.
BACKENDS = {
    "uccl_low_latency": "deepep_low_latency",
    "uccl_high_throughput": "deepep_high_throughput",
}

ENTRY_POINT_GROUP = "vllm.general_plugins"

# NOTES: vLLM has no all2all registry; the plugin patches ParallelConfig and the CLI kwargs and
# relies on the DeepEP managers' and prepare/finalize classes' call shapes, all of which move
# between 0.3x releases. So only versions CI has run are accepted (ci/setup.d/41-vllm.sh).
TESTED_VERSIONS = ("0.33.0",)


def installed_version() -> Optional[str]:
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def _truthy(raw: str) -> bool:
    return raw.strip().lower() in ("1", "true", "yes", "on")


def is_tested(version: Optional[str]) -> bool:
    if not version:
        return False
    # A local build suffix ("0.33.0+cu130") is the same release.
    return version.split("+", 1)[0] in TESTED_VERSIONS


def untested_allowed(environ=None) -> bool:
    return _truthy((os.environ if environ is None else environ).get(ALLOW_UNTESTED, ""))


def flag_set(environ=None) -> bool:
    return _truthy((os.environ if environ is None else environ).get(FLAG, ""))


def entry_point_registered() -> bool:
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # pragma: no cover - broken metadata on the path
        return False
    return any(ep.value.startswith("uccl_ep_vllm.") for ep in eps)
