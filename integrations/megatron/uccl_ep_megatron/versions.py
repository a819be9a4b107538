"""Which megatron-core versions the hook supports, and the check that enforces it.

The hook reaches into Megatron-Core internals that change between minor releases (the flex
dispatcher's manager classes, TransformerConfig's fields, the argument factory), so it only
installs on versions CI has run it against, unless the user opts in to an untested one.
"""

from __future__ import annotations

from typing import Optional

from uccl_ep import env
from uccl_ep.errors import MissingDependency, Unsupported

__all__ = ["SUPPORTED_SERIES", "TESTED_VERSIONS", "megatron_core_version", "check_megatron_core_version"]

#: (major, minor) release series the hook is written for
SUPPORTED_SERIES = ((0, 19),)
#: exact versions CI runs (core/tests/cpu/test_megatron_contract.py, integrations/megatron/tests/)
TESTED_VERSIONS = ("0.19.2",)


def megatron_core_version() -> tuple[int, int, int]:
    """(major, minor, patch) of the importable megatron-core."""
    try:
        from megatron.core import package_info
    except ImportError as exc:
        raise MissingDependency(
            "uccl-ep-megatron needs megatron-core (pip install 'megatron-core>=0.19,<0.20', or put the "
            f"Megatron-LM tree on PYTHONPATH); importing it failed: {exc}") from exc
    return int(package_info.MAJOR), int(package_info.MINOR), int(package_info.PATCH)


def check_megatron_core_version(allow_untested: Optional[bool] = None) -> tuple[int, int, int]:
    """Raise `Unsupported` unless megatron-core is in a supported series (or the user opted in)."""
    version = megatron_core_version()
    if version[:2] in SUPPORTED_SERIES:
        return version
    if allow_untested is None:
        allow_untested = env.get("UCCL_EP_MEGATRON_ALLOW_UNTESTED")
    if allow_untested:
        return version
    series = ", ".join(f"{a}.{b}.x" for a, b in SUPPORTED_SERIES)
    raise Unsupported(
        f"megatron-core {'.'.join(map(str, version))} is not supported by uccl-ep-megatron "
        f"(supported: {series}; tested: {', '.join(TESTED_VERSIONS)}). Install a supported version, or "
        "opt in to an untested one with UCCL_EP_MEGATRON_ALLOW_UNTESTED=1 / "
        "uccl_ep_megatron.install(allow_untested=True) / --uccl-allow-untested-megatron")
