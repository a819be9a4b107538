"""Warn when this drop-in shares an environment with SGLang >= 0.5.20 (which ships its own deep_ep)."""

from __future__ import annotations

import re
import warnings
from importlib import metadata


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def warn_if_beside_sglang() -> bool:
    """True (and a warning) when sglang >= 0.5.20 or sgl-deep-ep is installed here too."""
    found = []
    try:
        if _version_tuple(metadata.version("sglang")) >= (0, 5, 20):
            found.append(f"sglang {metadata.version('sglang')}")
    except metadata.PackageNotFoundError:
        pass
    try:
        found.append(f"sgl-deep-ep {metadata.version('sgl-deep-ep')}")
    except metadata.PackageNotFoundError:
        pass
    if found:
        warnings.warn(f"deep-ep-uccl is installed beside {' and '.join(found)}, which owns the `deep_ep` package "
                      "too; one overwrote the other. Uninstall deep-ep-uccl and use SGLang's "
                      "`--moe-a2a-backend uccl` plugin instead.", RuntimeWarning, stacklevel=3)
    return bool(found)
