"""uccl-ep-vllm: `--all2all-backend uccl_low_latency | uccl_high_throughput` for vLLM.

The entry point `uccl_ep_vllm.plugin:register` (group `vllm.general_plugins`) runs in every vLLM
process. This package's top level imports nothing from vllm, torch or CUDA, so `plugin_status()`
is cheap enough for `uccl-ep doctor`.
"""

from __future__ import annotations

import sys

from . import support

__version__ = "0.1.0"
__all__ = ["__version__", "plugin_status"]


def plugin_status() -> dict:
    """What `uccl-ep doctor` shows for vLLM. Reads package metadata and this process's state only.

    Keys: framework, plugin_version, framework_installed, framework_version, tested_versions,
    in_supported_range, entry_point_registered, flag_set (the process-wide selection flag),
    deep_ep_is_uccl_ep (this process's `deep_ep` name resolves to uccl_ep), backends (the new
    --all2all-backend values and the vLLM path each maps to), how_to_select, problems.
    """
    version = support.installed_version()
    problems = []
    if version is None:
        problems.append("vllm is not installed in this Python environment")
    elif not support.is_tested(version):
        problems.append(f"vllm {version} is outside the tested window {support.window_text()}: the uccl_* "
                        "backends run with a warning")
    registered = support.entry_point_registered()
    if not registered:
        problems.append("entry point `vllm.general_plugins: uccl_ep` is not registered "
                        "(pip install ./integrations/vllm from a uccl-ep checkout, in this environment)")
    alias = sys.modules.get("deep_ep")
    return {
        "framework": "vllm",
        "plugin_version": __version__,
        "framework_installed": version is not None,
        "framework_version": version,
        "tested_window": support.window_text(),
        "tested_versions": list(support.TESTED_VERSIONS),
        "in_supported_range": support.is_tested(version),
        "entry_point_registered": registered,
        "flag_set": support.flag_set(),
        "deep_ep_is_uccl_ep": bool(alias is not None and getattr(alias, "__uccl_ep__", False)),
        "backends": dict(support.BACKENDS),
        "how_to_select": "--all2all-backend uccl_low_latency | uccl_high_throughput (with --enable-expert-parallel)",
        "problems": problems,
    }
