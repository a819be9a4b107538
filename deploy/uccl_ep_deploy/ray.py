"""`uccl-ep launch ray`: render the Ray driver with the plan embedded, and run it.

The driver (``ray_driver.py``) needs only Python and Ray, so it runs with whichever interpreter has
Ray: ``--ray-python``, else this one if it can import ray, else the one behind the ``ray`` command.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import MissingDependency
from .plan import Plan

__all__ = ["render_driver", "find_ray_python", "run_driver"]

_MARK = "PLAN_JSON = None  # replaced by the renderer"


def render_driver(plan: Plan) -> str:
    source = (Path(__file__).with_name("ray_driver.py")).read_text()
    assert _MARK in source, "ray_driver.py lost its PLAN_JSON marker"
    header = (f"# Rendered by `uccl-ep launch ray` from {plan.source or plan.name}; re-render instead of editing.\n"
              f"# Run: python THIS_FILE --address HEAD_IP:6379   (Ray must be installed in that Python)\n")
    first_nl = source.index("\n") + 1  # keep the shebang first
    body = source[:first_nl] + header + source[first_nl:]
    return body.replace(_MARK, f"PLAN_JSON = {plan.to_json()!r}")


def find_ray_python(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    if importlib.util.find_spec("ray") is not None:
        return sys.executable
    ray_cmd = shutil.which("ray")
    if ray_cmd:
        with open(ray_cmd, "rb") as f:
            first = f.readline().decode(errors="replace").strip()
        if first.startswith("#!") and "python" in first:
            return first[2:].strip().split()[0]
    raise MissingDependency("the ray launcher needs Ray: `pip install 'ray[default]'` (or 'uccl-ep-deploy[ray]'), "
                            "or pass --ray-python PATH to an interpreter that has it")


def run_driver(script: Path, python: str, address: str | None, timeout_s: float,
               placement_timeout_s: float) -> int:
    cmd = [python, str(script), "--timeout", str(timeout_s), "--placement-timeout", str(placement_timeout_s)]
    if address:
        cmd += ["--address", address]
    # NOTES: the driver bounds the job itself; this outer bound only catches a driver stuck in Ray's
    # own start-up or shutdown. It sends SIGTERM first: the driver turns that into its normal
    # teardown (stop every node, remove actors and placement group), then SIGKILL as a backstop.
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait(timeout=timeout_s + placement_timeout_s + 180)
    except subprocess.TimeoutExpired:
        print("[uccl-ep ray] the driver did not finish in time; stopping it", file=sys.stderr)
        proc.terminate()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 124
