"""Which megatron-core versions the hook is tested with, and the check that warns outside them.

The hook reaches into Megatron-Core internals that change between minor releases (the flex
dispatcher's manager classes, TransformerConfig's fields, the argument factory). CI runs the
oldest and newest release of the tested window (ci/setup.d/30-megatron.sh); outside it the hook
installs with a warning, and a structural mismatch fails with a typed error where it is found
(e.g. config_patch refuses a TransformerConfig whose backend field is not a Literal).
"""

from __future__ import annotations

from uccl_ep.errors import MissingDependency
from uccl_ep.log import get_logger, warn_once

__all__ = ["TESTED_WINDOW", "TESTED_VERSIONS", "megatron_core_version", "in_tested_window", "window_text",
           "check_megatron_core_version"]

logger = get_logger("megatron")

#: oldest and newest tested release (inclusive)
TESTED_WINDOW = ((0, 19, 0), (0, 19, 2))
#: exact versions CI runs (integrations/megatron/tests/, core/tests/cpu/test_megatron_contract.py)
TESTED_VERSIONS = ("0.19.0", "0.19.2")


def megatron_core_version() -> tuple[int, int, int]:
    """(major, minor, patch) of the importable megatron-core."""
    try:
        from megatron.core import package_info
    except ImportError as exc:
        raise MissingDependency(
            "uccl-ep-megatron needs megatron-core (pip install 'megatron-core>=0.19', or put the "
            f"Megatron-LM tree on PYTHONPATH); importing it failed: {exc}") from exc
    return int(package_info.MAJOR), int(package_info.MINOR), int(package_info.PATCH)


def in_tested_window(version: tuple[int, int, int]) -> bool:
    return TESTED_WINDOW[0] <= tuple(version) <= TESTED_WINDOW[1]


def window_text() -> str:
    return "..".join(".".join(map(str, v)) for v in TESTED_WINDOW)


def check_megatron_core_version() -> tuple[int, int, int]:
    """The megatron-core version; a warning (once) when it is outside the tested window."""
    version = megatron_core_version()
    if not in_tested_window(version):
        warn_once(logger, f"megatron-core-{version}",
                  "uccl-ep-megatron: megatron-core %s is outside the tested window %s (CI runs %s); "
                  "--moe-flex-dispatcher-backend uccl is not verified on it", ".".join(map(str, version)),
                  window_text(), " and ".join(TESTED_VERSIONS))
    return version
