"""Shared helpers of the vLLM plugin tests: each scenario runs in a fresh interpreter (as vLLM runs
its front end, engine core and workers), bounded in time, reporting JSON on its last stdout line."""

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


def run_py(code: str, *, env=None, timeout=240) -> dict:
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("UCCL_EP_VLLM", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY",
                             "VLLM_PLUGINS", "VLLM_DEEPEPLL_NVFP4_DISPATCH")}
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=str(REPO))
    lines = [l for l in proc.stdout.strip().splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1])


_EXECUTORS: list = []


@pytest.fixture
def executor_summary() -> list:
    """Tests append "what ran: executor" lines; pytest prints them in its summary."""
    return _EXECUTORS


def pytest_terminal_summary(terminalreporter):
    if _EXECUTORS:
        terminalreporter.write_sep("-", "uccl_ep executors that ran under vLLM")
        for line in _EXECUTORS:
            terminalreporter.write_line(line)
