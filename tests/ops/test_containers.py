"""Dockerfiles: hadolint-clean, image ENV equal to the recipes' platform profiles (both ways), and a real
build on the lab's Docker engine: the base Dockerfile on a debootstrap Debian with uccl-ep installed
(torch from a wheel server on loopback), then `uccl-ep bench` inside the container."""

from __future__ import annotations

import http.server
import json
import shlex
import shutil
import threading
import tomllib
from functools import partial
from pathlib import Path

import pytest
from conftest import OPS_BIN, ROOT, VENV_PY, run

DOCKERFILES = sorted((ROOT / "containers").glob("*/Dockerfile"))
WHEELHOUSE = Path.home() / ".cache" / "uccl-ep-ops" / "wheels"


def test_hadolint_every_dockerfile():
    assert {d.parent.name for d in DOCKERFILES} >= {"base", "efa", "p5en", "p6-b200", "mi300x-thor2", "mi300x-cx7"}
    p = run([str(OPS_BIN / "hadolint"), "-c", str(ROOT / "containers" / ".hadolint.yaml"),
             *map(str, DOCKERFILES)], 120)
    assert p.returncode == 0, p.stdout


def image_env(dockerfile: Path) -> dict[str, str]:
    """ENV of a Dockerfile (continuation lines joined; quotes as the shell would remove them)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for word in shlex.split(line[4:]):
                key, _, value = word.partition("=")
                env[key] = value
    return env


@pytest.mark.parametrize("platform,layers", [("p5en", ("efa", "p5en")), ("p6-b200", ("efa", "p6-b200")),
                                             ("mi300x-thor2", ("mi300x-thor2",)), ("mi300x-cx7", ("mi300x-cx7",))])
def test_image_env_matches_platform_profile(platform, layers):
    with open(ROOT / "recipes" / "platforms" / f"{platform}.toml", "rb") as f:
        profile = tomllib.load(f)["env"]
    env: dict[str, str] = {}
    for layer in layers:
        env.update(image_env(ROOT / "containers" / layer / "Dockerfile"))
    nic = {k: v for k, v in env.items() if k.startswith(("FI_", "NCCL_", "UCCL_EP_", "HSA_", "RCCL_"))}
    assert nic, f"no NIC env in the {platform} image"
    for key, value in nic.items():
        assert profile.get(key) == value, f"{platform}: image {key}={value!r}, recipe profile {profile.get(key)!r}"
    for key, value in profile.items():  # and the other way: nothing the profile sets is missing from the image
        assert env.get(key) == value, f"{platform}: recipe profile {key}={value!r}, image {env.get(key)!r}"


@pytest.fixture(scope="module")
def wheel_server():
    """torch and friends as wheels, served on loopback for pip inside the build (no index, no CA)."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    p = run([str(VENV_PY), "-m", "pip", "download", "-q", "-d", str(WHEELHOUSE), "torch==2.11.0", "numpy", "rich", "pydantic>=2.6"], 900)
    assert p.returncode == 0, p.stdout[-3000:]
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(WHEELHOUSE))
    handler.log_message = lambda *a, **k: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def base_image(docker_lab, wheel_server, tmp_path_factory):
    """containers/base built on the debootstrap Debian, torch from the loopback wheel server."""
    ctx = tmp_path_factory.mktemp("ctx")
    shutil.copytree(ROOT / "containers" / "scripts", ctx / "scripts")
    shutil.copy(ROOT / "containers" / ".dockerignore", ctx / ".dockerignore")
    p = run([str(VENV_PY), "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(ctx / "dist"),
             str(ROOT / "core")], 600)
    assert p.returncode == 0, p.stdout[-3000:]
    # the launcher's wheel (pure Python; its build backend comes from the index, as for any user)
    p = run([str(VENV_PY), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(ctx / "dist"), str(ROOT / "deploy")], 600)
    assert p.returncode == 0, p.stdout[-3000:]
    p = run(["docker", "build", "--network", "host", "-f", str(ROOT / "containers" / "base" / "Dockerfile"),
             "--build-arg", "BASE_IMAGE=uccl-ep-ops/debian:bookworm", "--build-arg", f"PIP_FIND_LINKS={wheel_server}",
             "--build-arg", "PIP_NO_INDEX=1", "-t", "uccl-ep-ops/base:test", str(ctx)], 1200, docker_lab.docker_env)
    assert p.returncode == 0, p.stdout[-5000:]
    return "uccl-ep-ops/base:test", ctx


def docker(lab, *args: str, timeout: float = 300):
    return run(["docker", *args], timeout, lab.docker_env)


@pytest.mark.timeout(1500)
def test_build_base_image_and_bench_inside(docker_lab, base_image):
    image, _ = base_image
    # --shm-size: the host executor's regions are reserved in /dev/shm at creation (docker's default 64 MiB
    # holds one rank's normal-mode region, not two); the images' docs run with a larger /dev/shm too.
    p = docker(docker_lab, "run", "--rm", "--network", "none", "--shm-size", "1g", "-e", "UCCL_EP_VERBOSE_ENV=1", image,
               "uccl-ep", "bench", "--cpu", "--num-tokens", "64", "--hidden", "256", "--num-experts", "16",
               "--iters", "1", "--warmup", "0")
    assert p.returncode == 0, p.stdout[-5000:]
    assert "uccl-ep bench: 2 x CPU" in p.stdout
    rows = [ln for ln in p.stdout.splitlines() if ln.count("│") > 10 and ("dispatch" in ln or "combine" in ln)]
    assert len(rows) == 6 and all("│ ok" in r for r in rows), p.stdout[-3000:]
    p = docker(docker_lab, "run", "--rm", "--network", "none", image, "bash", "-c",
               "ldconfig -p | grep -c -E 'lib(fabric|ibverbs)\\.so' && fi_info -l | grep -q tcp && uccl-ep launch --help",
               timeout=120)
    assert p.returncode == 0, p.stdout


FAKE_CONFIGURE = """#!/bin/sh
# stands in for Broadcom's configure: a Makefile that builds and installs a provider library
cat > Makefile <<'MK'
all:
\tprintf 'int bnxt_fake(void) { return 0; }\\n' > fake.c
\tgcc -shared -fPIC -o libbnxt_re-rdmav34.so fake.c
install:
\tmkdir -p /usr/lib/libibverbs
\tcp libbnxt_re-rdmav34.so /usr/lib/libibverbs/
MK
"""


@pytest.mark.timeout(1500)
def test_thor2_image_rebuilds_bnxt_re_at_start(docker_lab, base_image, tmp_path):
    """The Thor-2 layer builds, carries its NIC env, and REBUILD_BNXT=1 swaps in a rebuilt provider."""
    image, ctx = base_image
    p = docker(docker_lab, "build", "--network", "host", "-f", str(ROOT / "containers" / "mi300x-thor2" / "Dockerfile"),
               "--build-arg", f"UCCL_EP_BASE={image}", "-t", "uccl-ep-ops/thor2:test", str(ctx), timeout=900)
    assert p.returncode == 0, p.stdout[-5000:]
    src = tmp_path / "libbnxt_re-9.9.9"
    src.mkdir()
    (src / "configure").write_text(FAKE_CONFIGURE)
    (src / "configure").chmod(0o755)
    run(["tar", "-C", str(tmp_path), "-czf", str(tmp_path / "libbnxt_re-9.9.9.tar.gz"), src.name], 60, check=True)
    p = docker(docker_lab, "run", "--rm", "--network", "none", "-v", f"{tmp_path}:/mnt:ro", "-e", "REBUILD_BNXT=1",
               "-e", "PATH_TO_BNXT_TAR_PACKAGE=/mnt/libbnxt_re-9.9.9.tar.gz", "uccl-ep-ops/thor2:test", "bash", "-c",
               "cat /etc/libibverbs.d/bnxt_re.driver; ls /usr/lib/x86_64-linux-gnu/libibverbs/; "
               "echo FI=$FI_VERBS_DEVICE_NAME GID=$FI_VERBS_GID_IDX INFLIGHT=$UCCL_EP_MAX_INFLIGHT")
    assert p.returncode == 0, p.stdout[-3000:]
    assert "driver /usr/lib/libibverbs/libbnxt_re" in p.stdout, p.stdout
    assert "libbnxt_re-rdmav34.so.distro" in p.stdout, p.stdout  # the distribution's copy moved aside
    assert "FI=bnxt_re GID=3 INFLIGHT=32" in p.stdout, p.stdout


def _doctor_json(torch_uses: str, hip_loadable: bool, hipcc: str | None) -> str:
    return json.dumps({"torch": "2.10.0+rocm7.2.2" if torch_uses == "hip" else "2.11.0+cu130",
                       "gpu_runtimes": {"torch_uses": torch_uses,
                                        "hip": {"loadable": hip_loadable, "path": "/opt/rocm/lib/libamdhip64.so",
                                                "why": "hipInit failed: hipErrorNoDevice"}},
                       "compilers": {"hipcc": hipcc, "hipcc_why": "no hipcc in /opt/rocm/bin"}})


@pytest.mark.parametrize("report,ok,says", [
    ((("hip", True, "/opt/rocm/bin/hipcc")), True, "torch 2.10.0+rocm7.2.2 (ROCm)"),
    ((("cuda", True, "/opt/rocm/bin/hipcc")), False, "torch is not a ROCm build"),
    ((("hip", False, "/opt/rocm/bin/hipcc")), False, "libamdhip64 does not load"),
    ((("hip", True, None)), False, "no hipcc"),
])
def test_rocm_image_check_reads_doctor(tmp_path, report, ok, says):
    """containers/scripts/check-rocm-image (the ROCm image's build-time check) on canned doctor reports."""
    fake = tmp_path / "uccl-ep"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{_doctor_json(*report)}\nEOF\n")
    fake.chmod(0o755)
    p = run([str(VENV_PY), str(ROOT / "containers" / "scripts" / "check-rocm-image")], 60,
            {"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert (p.returncode == 0) == ok and says in p.stdout, p.stdout
