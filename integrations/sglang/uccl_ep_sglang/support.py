"""Which SGLang versions the plugin supports, and how each one is hooked.

Everything here reads package metadata only (importlib.metadata): no sglang module, no torch, no
CUDA. `uccl-ep doctor` calls `plugin_status()` through this module.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from typing import Optional

__all__ = [
    "FLAG",
    "ALLOW_UNTESTED",
    "MIN_VERSION",
    "MAX_TESTED_VERSION",
    "TESTED_VERSIONS",
    "ENTRY_POINT_GROUP",
    "installed_version",
    "parse_version",
    "in_supported_range",
    "resolution_hook_target",
    "dispatcher_active_flag",
    "untested_allowed",
]

#: Set to "1" by the plugin when `uccl` was chosen; inherited by SGLang's scheduler processes,
#: which then run the DeepEP dispatcher on uccl_ep. Setting it by hand with
#: `--moe-a2a-backend deepep` selects uccl_ep the same way (registered in uccl_ep.env).
FLAG = "UCCL_EP_SGLANG"
#: "1" lets the plugin run on an SGLang newer than the newest tested one (uccl_ep.env).
ALLOW_UNTESTED = "UCCL_EP_SGLANG_ALLOW_UNTESTED"

ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "uccl_ep"

#: The plugin system (`sglang.srt.plugins`, HookRegistry) first shipped in 0.5.11.
MIN_VERSION = (0, 5, 11)
#: Newest version CI runs the plugin tests against.
MAX_TESTED_VERSION = (0, 5, 23)
#: Versions whose wheels CI installs and tests (ci/setup.d/40-sglang.sh).
TESTED_VERSIONS = ("0.5.23", "0.5.12")

# NOTES: 0.5.19 split resolution out of construction (`ServerArgs.resolve_once`); 0.5.20 turned
# ServerArgs into a msgspec Struct whose C layer binds __post_init__ at class creation, so a hook
# on __post_init__ would never fire there. Before 0.5.19, resolution runs in the dataclass's
# __post_init__, which looks the method up on the class at call time and so can be hooked.
_RESOLVE_ONCE_SINCE = (0, 5, 19)


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric release of a version string: "0.5.12.post1" -> (0, 5, 12)."""
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", text or "")
    if not match:
        return ()
    return tuple(int(p) for p in match.group(1).split("."))


def installed_version() -> Optional[str]:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def untested_allowed(environ=None) -> bool:
    raw = (os.environ if environ is None else environ).get(ALLOW_UNTESTED, "")
    return raw.strip().lower() in ("1", "true", "yes", "on")


def in_supported_range(version: Optional[str]) -> bool:
    release = parse_version(version or "")
    return bool(release) and MIN_VERSION <= release[:3] <= MAX_TESTED_VERSION


def resolution_hook_target(version: Optional[str]) -> str:
    """The ServerArgs method to hook BEFORE resolution for this SGLang version."""
    release = parse_version(version or "")
    if release and release[:3] < _RESOLVE_ONCE_SINCE:
        return "sglang.srt.server_args.ServerArgs.__post_init__"
    return "sglang.srt.server_args.ServerArgs.resolve_once"


def dispatcher_active_flag(environ=None) -> bool:
    raw = (os.environ if environ is None else environ).get(FLAG, "")
    return raw.strip().lower() in ("1", "true", "yes", "on")


def entry_point_registered() -> bool:
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # pragma: no cover - broken metadata on the path
        return False
    return any(ep.value.startswith("uccl_ep_sglang.") for ep in eps)
