"""uccl-ep-sglang: `--moe-a2a-backend uccl` for SGLang, through SGLang's DeepEP code path.

The entry point `uccl_ep_sglang.plugin:register` (group `sglang.srt.plugins`) runs in every
SGLang process. This package's top level imports nothing from sglang, torch or CUDA, so
`plugin_status()` is cheap enough for `uccl-ep doctor`.
"""

from __future__ import annotations

import sys

from . import support

__version__ = "0.1.0"
__all__ = ["__version__", "plugin_status"]

_DISPATCHER_MODULE = "sglang.srt.layers.moe.token_dispatcher.deepep"


def plugin_status() -> dict:
    """What `uccl-ep doctor` shows for SGLang. Reads package metadata and this process's state only.

    Keys: framework, plugin_version, framework_installed, framework_version, supported_range,
    tested_window, tested_versions, in_supported_range (the plugin can load), in_tested_window, entry_point_registered, flag_set (the process-wide
    selection flag), dispatcher_swapped (this process's DeepEP dispatcher module already runs on
    uccl_ep), how_to_select, problems (list of human-readable strings, empty when all is well).
    """
    version = support.installed_version()
    problems = []
    if version is None:
        problems.append("sglang is not installed in this Python environment")
    elif not support.in_supported_range(version):
        problems.append(f"sglang {version} has no plugin system (needs >= "
                        f"{'.'.join(map(str, support.MIN_VERSION))}); use the deep_ep drop-in with "
                        "--moe-a2a-backend deepep")
    elif not support.in_tested_window(version):
        problems.append(f"sglang {version} is outside the tested window {support.window_text()}: "
                        "--moe-a2a-backend uccl runs with a warning")
    registered = support.entry_point_registered()
    if not registered:
        problems.append("entry point `sglang.srt.plugins: uccl_ep` is not registered "
                        "(pip install ./integrations/sglang from a uccl-ep checkout, in this environment)")
    module = sys.modules.get(_DISPATCHER_MODULE)
    return {
        "framework": "sglang",
        "plugin_version": __version__,
        "framework_installed": version is not None,
        "framework_version": version,
        "supported_range": ">=%s" % ".".join(map(str, support.MIN_VERSION)),
        "tested_window": support.window_text(),
        "tested_versions": list(support.TESTED_VERSIONS),
        "in_supported_range": support.in_supported_range(version),
        "in_tested_window": support.in_tested_window(version),
        "entry_point_registered": registered,
        "flag_set": support.dispatcher_active_flag(),
        "dispatcher_swapped": bool(module is not None and getattr(module, "__uccl_ep__", False)),
        "how_to_select": "--moe-a2a-backend uccl",
        "problems": problems,
    }
