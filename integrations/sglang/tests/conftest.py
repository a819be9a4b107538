"""Shared helpers of the SGLang plugin tests: each scenario runs in a fresh interpreter (as SGLang
runs each of its processes), bounded in time, and reports JSON on its last stdout line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PLUGIN_ROOT = HERE.parent
REPO = PLUGIN_ROOT.parent.parent
ALT_0512 = REPO / ".venv-sglang" / "alt" / "sglang-0.5.12"
TINY_CONFIG = PLUGIN_ROOT / "gpu" / "tiny_qwen3_moe_config.json"

#: (label, PYTHONPATH prefix) of every SGLang version the plugin is tested with.
VERSIONS = [("0.5.23", None), ("0.5.12", ALT_0512)]


def run_py(code: str, *, version_path=None, env=None, timeout=240) -> dict:
    """Run `code` in a fresh python; its last stdout line must be JSON. Fails with the output."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("UCCL_EP_SGLANG",))}
    full_env.update(env or {})
    if version_path is not None:
        if not Path(version_path, "sglang").is_dir():
            pytest.fail(f"{version_path} missing: run ci/setup.d/40-sglang.sh")
        full_env["PYTHONPATH"] = str(version_path)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=str(REPO))
    lines = [l for l in proc.stdout.strip().splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1])


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("tiny-moe")
    (d / "config.json").write_text(TINY_CONFIG.read_text())
    return str(d)


@pytest.fixture(params=VERSIONS, ids=[v for v, _ in VERSIONS])
def sglang_version(request):
    return request.param


_EXECUTORS: list = []


@pytest.fixture
def executor_summary() -> list:
    """Tests append "what ran: executor" lines; pytest prints them in its summary."""
    return _EXECUTORS


def pytest_terminal_summary(terminalreporter):
    if _EXECUTORS:
        terminalreporter.write_sep("-", "uccl_ep executors that ran under SGLang")
        for line in _EXECUTORS:
            terminalreporter.write_line(line)
