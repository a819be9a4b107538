"""Which SGLang versions the plugin supports, and how each one is hooked.

Everything here reads package metadata only (importlib.metadata): no sglang module, no torch, no
CUDA. `uccl-ep doctor` calls `plugin_status()` through this module.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Optional

__all__ = [
    "FLAG",
    "MIN_VERSION",
    "TESTED_WINDOW",
    "TESTED_VERSIONS",
    "ENTRY_POINT_GROUP",
    "installed_version",
    "parse_version",
    "in_supported_range",
    "in_tested_window",
    "window_text",
    "resolution_hook_target",
    "dispatcher_active_flag",
]

#: Set to "1" by the plugin when `uccl` was chosen; inherited by SGLang's scheduler processes,
#: which then run the DeepEP dispatcher on uccl_ep. Setting it by hand with
#: `--moe-a2a-backend deepep` selects uccl_ep the same way (registered in uccl_ep.env).
FLAG = "UCCL_EP_SGLANG"

ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "uccl_ep"

#: The plugin system (`sglang.srt.plugins`, HookRegistry) first shipped in 0.5.11: older releases
#: cannot load the plugin at all and are refused.
MIN_VERSION = (0, 5, 11)
#: The tested window: CI runs its oldest and newest release (ci/setup.d/40-sglang.sh); releases
#: outside it (>= MIN_VERSION) run with a warning.
TESTED_WINDOW = ((0, 5, 12), (0, 5, 23))
#: Versions whose wheels CI installs and tests.
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


def in_supported_range(version: Optional[str]) -> bool:
    """The plugin can load (SGLang has the plugin system); the tested window is `in_tested_window`."""
    release = parse_version(version or "")
    return bool(release) and release[:3] >= MIN_VERSION


def in_tested_window(version: Optional[str]) -> bool:
    release = parse_version(version or "")
    return bool(release) and TESTED_WINDOW[0] <= release[:3] <= TESTED_WINDOW[1]


def window_text() -> str:
    return "..".join(".".join(map(str, v)) for v in TESTED_WINDOW)


def resolution_hook_target(version: Optional[str]) -> str:
    """The ServerArgs method to hook BEFORE resolution for this SGLang version."""
    release = parse_version(version or "")
    if release and release[:3] < _RESOLVE_ONCE_SINCE:
        return "sglang.srt.server_args.ServerArgs.__post_init__"
    return "sglang.srt.server_args.ServerArgs.resolve_once"


def dispatcher_active_flag(environ=None) -> bool:
    """UCCL_EP_SGLANG through uccl_ep's registry (a value that is no boolean is an InvalidArgument)."""
    from uccl_ep import env
    return bool(env.get(FLAG, environ))


def entry_point_registered() -> bool:
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # pragma: no cover - broken metadata on the path
        return False
    return any(ep.value.startswith("uccl_ep_sglang.") for ep in eps)
