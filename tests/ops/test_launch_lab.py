"""The launches for real: locally, on the lab's 2-node Slurm and on its 2-node Ray cluster.

Each target runs the CPU recipe's `uccl-ep bench` across both "nodes" to completion, and a probe
job (tests/ops/probe_node.py in place of the bench) checks ranks, rendezvous, env and container
flags, and that one failing node stops the whole job, within bounds, with nothing left running.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from conftest import HERE, OPS_BIN, VENV_PY, uccl_ep

pytestmark = pytest.mark.timeout(400)
PROBE = str(HERE / "probe_node.py")
BENCH = ["local/bench-cpu", "--python", str(VENV_PY)]


def probe_args(tmp: Path, *extra: str) -> list[str]:
    return [*BENCH, "--set", f'launch.entry=["{PROBE}"]', "--set", f'env.PROBE_DIR="{tmp}"', *extra]


def ranks(tmp: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(tmp.glob("rank*.json"))]


def assert_bench_table(out: str) -> None:
    assert "uccl-ep bench: 2 x CPU" in out, out[-3000:]
    # NOTES: the lab's two Ray nodes share one host and one log directory, so Ray may stream a line
    # twice (with and without the node's ip); compare rows from the table's first border on.
    rows = {ln[ln.index("│"):].split("\x1b")[0] for ln in out.splitlines()
            if ln.count("│") > 10 and ("dispatch" in ln or "combine" in ln)}
    # local/bench-cpu runs both modes: 3 normal-mode rows (dispatch bf16/fp8, combine) + 3 LL rows (dispatch, combine BF16, combine LogFMT)
    assert len(rows) == 6 and all("│ ok" in r for r in rows), out[-3000:]
    assert {r.split("│")[1].strip() for r in rows} == {"ht", "ll"}, out[-3000:]


def assert_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), f"left running: {[p for p in pids if _alive(p)]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().split(")")[-1].split()[0] != "Z"


# --------------------------------------------------------------------------------------------
def test_local_bench_two_nodes():
    p = uccl_ep("launch", "local", *BENCH, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:]
    assert_bench_table(p.stdout)
    assert "[uccl-ep local] all 2 node(s) finished" in p.stdout


def test_local_failure_stops_every_node(tmp_path):
    t0 = time.monotonic()
    p = uccl_ep("launch", "local", *probe_args(tmp_path, "--set", "env.PROBE_FAIL_NODE=1",
                                               "--set", "env.PROBE_SLEEP=300"), timeout=120)
    assert p.returncode != 0 and "node 1 exited with" in p.stdout, p.stdout[-3000:]
    assert time.monotonic() - t0 < 90
    got = ranks(tmp_path)
    assert sorted(r["NODE_RANK"] for r in got) == ["0", "1"]
    assert_gone([r["pid"] for r in got])


# --------------------------------------------------------------------------------------------
def test_slurm_bench_across_two_nodes(slurm, tmp_path):
    p = uccl_ep("launch", "slurm", *BENCH, "--wait", "-o", str(tmp_path / "job.sbatch"),
                "--log", str(tmp_path / "job-%j.out"), timeout=330, env=slurm.slurm_env, cwd=str(tmp_path))
    assert p.returncode == 0 and "exited with 0" in p.stdout, p.stdout[-3000:]
    out = next(tmp_path.glob("job-*.out")).read_text()
    assert "head node1 at 127.0.0.11:29650" in out
    assert "node 0/2 node1 starting" in out and "node 1/2 node2 starting" in out
    assert_bench_table(out)


def test_slurm_env_ranks_and_container_flags(slurm, tmp_path):
    p = uccl_ep("launch", "slurm", *probe_args(tmp_path, "--image", "/images/uccl-ep-test.sqsh",
                                               "--set", 'container.mounts=["/data:/data"]'),
                "--wait", "-o", str(tmp_path / "job.sbatch"), "--log", str(tmp_path / "job-%j.out"),
                timeout=200, env=slurm.slurm_env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + "".join(f.read_text() for f in tmp_path.glob("job-*.out"))
    got = ranks(tmp_path)
    assert [r["RANK"] for r in got] == ["0", "1"] and {r["WORLD_SIZE"] for r in got} == {"2"}
    assert {r["SLURMD_NODENAME"]: r["NODE_RANK"] for r in got} == {"node1": "0", "node2": "1"}
    assert {r["MASTER_ADDR"] for r in got} == {"127.0.0.11"}
    assert {r["PYXIS_STUB_IMAGE"] for r in got} == {"/images/uccl-ep-test.sqsh"}
    assert {r["PYXIS_STUB_MOUNTS"] for r in got} == {"/data:/data"}
    assert {r["UCCL_EP_FABRIC_PROVIDER"] for r in got} == {"tcp;ofi_rxm"}


def test_slurm_failing_node_fails_the_job(slurm, tmp_path):
    t0 = time.monotonic()
    p = uccl_ep("launch", "slurm", *probe_args(tmp_path, "--set", "env.PROBE_FAIL_NODE=1",
                                               "--set", "env.PROBE_SLEEP=300"),
                "--wait", "-o", str(tmp_path / "job.sbatch"), "--log", str(tmp_path / "job-%j.out"),
                timeout=200, env=slurm.slurm_env, cwd=str(tmp_path))
    assert p.returncode != 0 and "exited with 0" not in p.stdout, p.stdout
    assert time.monotonic() - t0 < 150, "srun --kill-on-bad-exit did not stop the sleeping node"
    assert_gone([r["pid"] for r in ranks(tmp_path)])


# --------------------------------------------------------------------------------------------
RAY = ["--address", "127.0.0.2:26379", "--ray-python", str(OPS_BIN / "python")]
# the same launch through Ray's job submission API (the dashboard): the job directory is uploaded,
# the driver runs on the cluster, its log streams back here
JOBS = ["--address", "http://127.0.0.2:28265", "--ray-python", str(OPS_BIN / "python"),
        "--job-python", str(OPS_BIN / "python")]
HOW = {"gcs": RAY, "jobs": JOBS}


@pytest.mark.parametrize("how", HOW)
def test_ray_bench_across_two_nodes(ray_lab, tmp_path, how):
    p = uccl_ep("launch", "ray", *BENCH, *HOW[how], "-o", str(tmp_path / "job"), timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-4000:]
    assert "[uccl-ep ray] all nodes finished" in p.stdout
    assert "127.0.0.2" in p.stdout and "127.0.0.3" in p.stdout
    assert_bench_table(p.stdout)
    assert sorted(f.name for f in (tmp_path / "job").iterdir()) == ["plan.json", "ray_driver.py"]
    if how == "jobs":
        assert re.search(r"\[uccl-ep ray\] submitted job \S+ to http://127.0.0.2:28265", p.stdout), p.stdout[-3000:]
        assert re.search(r"job \S+ succeeded", p.stdout)
        assert "following by polling" not in p.stdout, p.stdout[-3000:]  # the log came by the dashboard's stream
    assert_ray_clean()


@pytest.mark.parametrize("how", HOW)
def test_ray_ranks_env_and_stop_on_failure(ray_lab, tmp_path, how):
    t0 = time.monotonic()
    p = uccl_ep("launch", "ray", *probe_args(tmp_path, "--set", "env.PROBE_FAIL_NODE=1",
                                             "--set", "env.PROBE_SLEEP=300"), *HOW[how], timeout=200, cwd=str(tmp_path))
    assert p.returncode != 0 and "[uccl-ep ray] node 1 exited with" in p.stdout, p.stdout[-3000:]
    assert how == "gcs" or re.search(r"job \S+ failed", p.stdout), p.stdout[-2000:]
    assert time.monotonic() - t0 < 150
    got = ranks(tmp_path)
    assert sorted(r["NODE_RANK"] for r in got) == ["0", "1"] and {r["WORLD_SIZE"] for r in got} == {"2"}
    assert {r["MASTER_ADDR"] for r in got} <= {"127.0.0.2", "127.0.0.3"} and len({r["MASTER_ADDR"] for r in got}) == 1
    assert {r["CUDA_VISIBLE_DEVICES"] for r in got} == {"0,1,2,3,4,5,6,7"} or {r["CUDA_VISIBLE_DEVICES"] for r in got} == {None}
    assert_gone([r["pid"] for r in got])
    assert_ray_clean()


def assert_ray_clean() -> None:
    """No actor or placement group of ours survives the launch."""
    import subprocess
    code = ("import ray, json; ray.init(address='127.0.0.2:26379', logging_level='error');"
            "import ray._private.state as st; from ray.util import placement_group_table as t;"
            "print(json.dumps([v['state'] for v in t().values()]));"
            "print(json.dumps([a.get('State', a.get('state')) for a in st.actors().values()]))")
    out = subprocess.run([str(OPS_BIN / "python"), "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    pgs, actors = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    assert all(s == "REMOVED" for s in pgs), pgs
    assert all(s == "DEAD" for s in actors), actors
