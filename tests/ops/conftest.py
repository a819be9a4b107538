"""Ops suite: recipes, renderers and the launch CLI (fast), then the same launches for real on a
throw-away lab on this host (tests/ops/lab.sh): a 2-node Slurm, a 2-node Ray cluster, a Docker
engine. Lab daemons are started once per session, on first use, and always stopped at the end.

Every wait is bounded: subprocesses get timeouts, pytest-timeout caps each test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VENV_PY = ROOT / ".venv" / "bin" / "python"
OPS_BIN = ROOT / ".venv-ops" / "bin"
UCCL_EP = ROOT / ".venv" / "bin" / "uccl-ep"
sys.path.insert(0, str(HERE))


def run(cmd: list[str], timeout: float, env: dict | None = None, check: bool = False, **kw) -> subprocess.CompletedProcess:
    """Run with a bound; output captured as text (stderr folded into stdout)."""
    full = dict(os.environ)
    full.update(env or {})
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=full, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}:\n{p.stdout[-4000:]}")
    return p


class Lab:
    """The lab directory and its daemons; `up(x)` starts x once, `down()` stops all."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.started: set[str] = set()
        self.env = {"LAB": str(path), "OPS_RAY": str(OPS_BIN / "ray")}

    def up(self, what: str, timeout: float) -> None:
        if what in self.started:
            return
        if os.geteuid() != 0:
            pytest.fail("the ops lab needs root (dockerd, slurmd, mknod); CI runs as root")
        p = run(["bash", str(HERE / "lab.sh"), f"{what}-up"], timeout, self.env)
        self.started.add(what)  # even on failure: down() must clean a half-started daemon
        assert p.returncode == 0, f"lab.sh {what}-up failed:\n{p.stdout[-4000:]}"

    def down(self) -> None:
        run(["bash", str(HERE / "lab.sh"), "down"], 240, self.env)

    @property
    def slurm_env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.path / "slurm" / "slurm.conf")}

    @property
    def docker_env(self) -> dict[str, str]:
        return {"DOCKER_HOST": f"unix://{self.path}/docker.sock"}


@pytest.fixture(scope="session")
def lab():
    # NOTES: ci/test.d/50-ops.sh passes UCCL_EP_OPS_LAB so that its EXIT trap can also run
    # `lab.sh down` if pytest itself is killed; a short path keeps unix socket paths legal.
    given = os.environ.get("UCCL_EP_OPS_LAB")
    path = Path(given) if given else Path(tempfile.mkdtemp(prefix="ueo", dir="/tmp"))
    path.mkdir(parents=True, exist_ok=True)
    the_lab = Lab(path)
    try:
        yield the_lab
    finally:
        if the_lab.started:
            the_lab.down()
        if not given:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm(lab):
    lab.up("slurm", 180)
    return lab


@pytest.fixture(scope="session")
def ray_lab(lab):
    lab.up("ray", 700)
    return lab


@pytest.fixture(scope="session")
def docker_lab(lab):
    lab.up("docker", 1200)
    return lab


def uccl_ep(*args: str, timeout: float = 120, env: dict | None = None, cwd: str | None = None):
    return run([str(UCCL_EP), *args], timeout, env, cwd=cwd)
