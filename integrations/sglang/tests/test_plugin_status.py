"""plugin_status() for `uccl-ep doctor`, and the version logic behind it."""

from __future__ import annotations

import pytest

from conftest import run_py

from uccl_ep_sglang import support


def test_plugin_status_is_cheap_and_complete():
    out = run_py("""
        import json, sys
        import uccl_ep_sglang
        st = uccl_ep_sglang.plugin_status()
        heavy = sorted(m for m in ("torch", "sglang", "uccl_ep.buffer") if m in sys.modules)
        print(json.dumps({"status": st, "heavy": heavy}))
    """)
    st = out["status"]
    assert out["heavy"] == [], "plugin_status() must not import torch, sglang or uccl_ep beyond its env registry"
    assert st["framework_version"] == "0.5.23" and st["in_supported_range"] is True and st["in_tested_window"]
    assert st["tested_window"] == "0.5.12..0.5.23"
    assert st["entry_point_registered"] is True and st["problems"] == []
    assert st["flag_set"] is False and st["dispatcher_swapped"] is False
    assert st["how_to_select"] == "--moe-a2a-backend uccl"


def test_plugin_status_reports_older_release(sglang_version):
    label, path = sglang_version
    out = run_py("import json, uccl_ep_sglang; print(json.dumps(uccl_ep_sglang.plugin_status()))",
                 version_path=path)
    assert out["framework_version"] == label and out["in_supported_range"] is True and out["in_tested_window"]


@pytest.mark.parametrize("version,loads,tested", [("0.5.11", True, False), ("0.5.12.post1", True, True),
                                                  ("0.5.23", True, True), ("0.5.10.post1", False, False),
                                                  ("0.5.24", True, False), ("0.6.0", True, False), ("", False, False)])
def test_supported_range_and_tested_window(version, loads, tested):
    assert support.in_supported_range(version) is loads and support.in_tested_window(version) is tested


@pytest.mark.parametrize("version,method", [("0.5.11", "__post_init__"), ("0.5.18", "__post_init__"),
                                            ("0.5.19", "resolve_once"), ("0.5.23", "resolve_once")])
def test_resolution_hook_target_by_version(version, method):
    assert support.resolution_hook_target(version).endswith("ServerArgs." + method)
