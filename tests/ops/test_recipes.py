"""Recipes, schema errors and renderers: no daemons, no network."""

from __future__ import annotations

import json
import py_compile
import re
import shlex
import subprocess
import tomllib
from pathlib import Path, PurePosixPath

import pytest
from conftest import OPS_BIN, ROOT, VENV_PY, run, uccl_ep

from uccl_ep_deploy import InvalidArgument, build_plan, list_recipes, load, load_recipe
from uccl_ep_deploy.catalog import PACKAGED_RECIPES
from uccl_ep_deploy.plan import MASTER_ADDR, NodeVar, Plan, evaluate_argv, tok, token_to_shell
from uccl_ep_deploy.ray_launch import write_job_dir
from uccl_ep_deploy.slurm import render_sbatch

RECIPES = [(n, p) for n, p in list_recipes(str(ROOT / "recipes")) if p.is_relative_to(ROOT / "recipes")]
FRAMEWORKS_SEEN = {load_recipe(p).framework for _, p in RECIPES}


def test_catalog_covers_every_framework_model_platform():
    names = {n for n, _ in RECIPES}
    for fw in ("sglang", "vllm", "megatron"):
        for model in ("deepseek-v3", "qwen3-235b", "tiny-moe"):
            for plat in ("p5en", "p6-b200", "mi300x-thor2", "mi300x-cx7"):
                assert f"{fw}/{model}-{plat}" in names
    assert {"primus/deepseek-v3-mi300x-thor2", "primus/deepseek-v3-mi300x-cx7", "local/bench-cpu"} <= names
    assert FRAMEWORKS_SEEN == {"bench", "sglang", "vllm", "megatron", "primus"}


@pytest.mark.parametrize("name,path", RECIPES, ids=[n for n, _ in RECIPES])
def test_every_recipe_validates_and_renders(name, path, tmp_path):
    r = load_recipe(path)
    assert r.platform in path.stem or r.platform == "local" or name.startswith("bench/")
    plan = build_plan(r)
    script = render_sbatch(r, plan)
    sb = tmp_path / "job.sbatch"
    sb.write_text(script)
    assert subprocess.run(["bash", "-n", str(sb)], capture_output=True).returncode == 0
    assert f"#SBATCH --nodes={r.cluster.nodes}" in script
    for k, v in r.env.items():  # the platform's NIC env reaches every node
        assert f"export {k}={shlex.quote(v)}" in script
    job = write_job_dir(plan, tmp_path / "job")  # the driver as shipped, beside the plan
    py_compile.compile(str(job / "ray_driver.py"), doraise=True)
    assert Plan.from_json((job / "plan.json").read_text()).head_argv == plan.head_argv


def test_framework_multinode_flags():
    sg = build_plan(load("sglang/deepseek-v3-p5en"))
    head = evaluate_argv(sg.head_argv, {"node_rank": 1, "master_addr": "10.0.0.1", "master_port": 5000})
    assert head[:3] == ["python3", "-m", "sglang.launch_server"]
    assert "--dist-init-addr" in head and head[head.index("--dist-init-addr") + 1] == "10.0.0.1:5000"
    assert head[head.index("--node-rank") + 1] == "1" and head[head.index("--moe-a2a-backend") + 1] == "uccl"
    assert sg.env["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] == "128"
    vl = build_plan(load("vllm/deepseek-v3-mi300x-cx7"))
    w = evaluate_argv(vl.worker_argv, {"node_rank": 1, "master_addr": "h", "master_port": 13345})
    assert w[w.index("--data-parallel-start-rank") + 1] == "8" and "--headless" in w
    assert "--headless" not in evaluate_argv(vl.head_argv, {"node_rank": 0, "master_addr": "h", "master_port": 1})
    assert vl.env["VLLM_DEEPEP_BUFFER_SIZE_MB"] == "1024" and vl.env["FI_VERBS_GID_IDX"] == "3"
    mg = build_plan(load("megatron/deepseek-v3-p6-b200"))
    m = evaluate_argv(mg.head_argv, {"node_rank": 3, "master_addr": "h", "master_port": 29500})
    assert m[1:3] == ["-m", "torch.distributed.run"] and m[m.index("--nnodes") + 1] == "4"
    assert m[m.index("--node-rank") + 1] == "3" and "uccl_ep_megatron" in m
    assert m[m.index("--moe-flex-dispatcher-backend") + 1] == "uccl"
    pr = build_plan(load("primus/deepseek-v3-mi300x-thor2"))
    assert pr.env["PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND"] == "UCCL" and pr.env["UCCL_EP_MAX_INFLIGHT"] == "32"


def test_shell_rendering_of_node_values():
    assert token_to_shell(tok(MASTER_ADDR, ":", 5000)) == '"${MASTER_ADDR}:5000"'
    assert token_to_shell(tok(NodeVar("node_rank", 8))) == '"$((NODE_RANK * 8 + 0))"'
    assert token_to_shell(tok("a b$c")) == "'a b$c'"
    out = subprocess.run(["bash", "-c", f"NODE_RANK=2 MASTER_ADDR=x; echo {token_to_shell(tok(NodeVar('node_rank', 8)))} "
                          f"{token_to_shell(tok(MASTER_ADDR, ':$1'))}"], capture_output=True, text=True).stdout
    assert out.split() == ["16", "x:$1"]


def _bad(tmp_path: Path, body: str, platform: bool = True) -> str:
    f = tmp_path / "r.toml"
    ext = f'extends = "{ROOT}/recipes/platforms/local.toml"\n' if platform else ""
    f.write_text(ext + body)
    with pytest.raises(InvalidArgument) as e:
        build_plan(load_recipe(f))
    return str(e.value)


@pytest.mark.parametrize("body,needle", [
    ('[recipe]\nframework = "bench"\n[cluster]\nnodez = 2\n', "cluster.nodez"),
    ('[recipe]\nframework = "bench"\n[cluster]\nnodes = 0\n', "cluster.nodes"),
    ('[recipe]\nframework = "bench"\n[cluster]\nnodes = "2"\n', "an integer"),
    ('[recipe]\nframework = "deepspeed"\n', "one of bench, sglang, vllm, megatron, primus"),
    ('[recipe]\nframework = "bench"\n[env]\n"BAD-NAME" = "1"\n', "env.BAD-NAME"),
    ('[recipe]\nframework = "bench"\n[cluster]\ntime_limit = "90 minutes"\n', "Slurm time"),
    ('[recipe]\nframework = "megatron"\n', "launch.entry"),
    ('[recipe]\nframework = "sglang"\n[buffers]\nnvl_mb = 64\n', "buffers.nvl_mb"),
    ('[recipe]\nframework = "vllm"\nmodel = "m"\n[buffers]\nll_max_tokens_per_rank = 2048\n', "[0, 1024]"),
    ('[recipe]\nframework = "sglang"\n', "recipe.model"),
    ('[recipe]\nframework = "bench"\n[container]\nmounts = ["/data"]\n', "SRC:DST"),
])
def test_schema_errors_name_the_field(tmp_path, body, needle):
    msg = _bad(tmp_path, body)
    assert needle in msg and "r.toml" in msg, msg


def test_extends_cycle_and_bad_toml(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(InvalidArgument, match="no cycles"):
        load_recipe(tmp_path / "a.toml")
    (tmp_path / "c.toml").write_text("[recipe\n")
    with pytest.raises(InvalidArgument, match="valid TOML"):
        load_recipe(tmp_path / "c.toml")


def test_overrides_and_lookup():
    r = load("bench-cpu", ["cluster.nodes=3", "env.NCCL_DEBUG=INFO", 'args.hidden=1024', "launch.python=/x/py"])
    assert (r.cluster.nodes, r.env["NCCL_DEBUG"], r.args["hidden"], r.launch.python) == (3, "INFO", 1024, "/x/py")
    with pytest.raises(InvalidArgument, match="ambiguous|one recipe"):
        load("deepseek-v3-p5en")  # sglang/, vllm/ and megatron/ all have one
    with pytest.raises(InvalidArgument, match="did you mean"):
        load("sglang/deepseek-v3")


def test_cli_list_show_dry_run_and_errors():
    p = uccl_ep("launch", "list")
    assert p.returncode == 0 and "sglang/qwen3-235b-mi300x-thor2" in p.stdout
    p = uccl_ep("launch", "show", "vllm/tiny-moe-p5en")
    assert p.returncode == 0 and json.loads(p.stdout.split("\n# node 0")[0])["framework"] == "vllm"
    p = uccl_ep("launch", "slurm", "sglang/deepseek-v3-p5en", "--dry-run", "--image", "/img/uccl-ep.sqsh")
    assert p.returncode == 0 and "--container-image=/img/uccl-ep.sqsh" in p.stdout
    assert re.search(r"^srun --nodes=2 ", p.stdout, re.M) and "/dev/tcp/$MASTER_ADDR/30000" in p.stdout
    p = uccl_ep("launch", "ray", "megatron/tiny-moe-p5en", "--dry-run")
    assert p.returncode == 0 and "STRICT_SPREAD" in p.stdout and "--node-rank" in p.stdout
    assert "ray_driver.py" in p.stdout and "job submission" not in p.stdout
    p = uccl_ep("launch", "ray", "bench-cpu", "--dry-run", "--address", "http://10.0.0.1:8265")
    assert p.returncode == 0 and "Ray's job submission API" in p.stdout
    assert "ray job submit --address http://10.0.0.1:8265 --working-dir JOB_DIR -- python ray_driver.py" in p.stdout
    p = uccl_ep("launch", "local", "bench-cpu", "--dry-run", "--nodes", "3")
    assert p.returncode == 0 and p.stdout.count("--nnodes 3") == 3
    p = uccl_ep("launch", "slurm", "bench-cpu", "--dry-run", "--set", "cluster.nodes=0")
    assert p.returncode == 2 and "cluster.nodes" in p.stdout and "Traceback" not in p.stdout


def test_rendered_examples_are_current(monkeypatch):
    """slurm/*.sbatch and ray/*.plan.json are rendered examples; slurm/render.sh re-renders them."""
    monkeypatch.chdir(ROOT)  # recipe sources are shown relative to the working directory
    by_name = {load_recipe(p).name: n for n, p in RECIPES}
    sbatch = sorted((ROOT / "slurm").glob("*.sbatch"))
    plans = sorted((ROOT / "ray").glob("*.plan.json"))
    assert sbatch and plans, "slurm/ and ray/ hold no rendered examples"
    for f in sbatch:
        r = load(by_name[f.stem])
        assert render_sbatch(r, build_plan(r)) + "\n" == f.read_text(), f"{f} is stale: run slurm/render.sh"
    for f in plans:
        r = load(by_name[f.name.removesuffix(".plan.json")])
        assert build_plan(r).to_json() + "\n" == f.read_text(), f"{f} is stale: run slurm/render.sh"


def test_recipes_travel_with_the_distribution(tmp_path, monkeypatch):
    """Every recipe file is package data of uccl-ep-deploy (deploy/pyproject.toml: the recipe folders
    are namespace packages, each shipping the file names of its "*" patterns), and names resolve from
    the shipped recipes where there is neither ./recipes nor UCCL_EP_RECIPES_DIR."""
    setuptools = tomllib.loads((ROOT / "deploy" / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["packages"]["find"] == {"include": ["uccl_ep_deploy*"], "namespaces": True}
    patterns = setuptools["package-data"]["*"]
    files = [p for p in (ROOT / "deploy" / "uccl_ep_deploy" / "recipes").rglob("*") if p.is_file()]
    assert len(files) > 40
    unshipped = [str(f) for f in files if not any(PurePosixPath(f.name).match(g) for g in patterns)]
    assert not unshipped, unshipped
    assert (ROOT / "recipes").resolve() == PACKAGED_RECIPES  # the repository's recipes/ is the package's
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("UCCL_EP_RECIPES_DIR", raising=False)
    found = dict(list_recipes())
    assert "local/bench-cpu" in found and all(p.is_relative_to(PACKAGED_RECIPES) for p in found.values())


_RENDER = ("import sys; from uccl_ep_deploy.cli import main; rc = main(['slurm', 'local/bench-cpu', '--dry-run']); "
           "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'uccl_ep')); "
           "assert rc == 0 and not bad, (rc, bad)")


def test_rendering_needs_neither_torch_nor_uccl_ep(tmp_path):
    """A login node renders with uccl-ep-deploy alone: nothing on the way imports torch or uccl_ep, and
    .venv-ops, which has no torch, renders the same script with its `uccl-ep-launch`."""
    p = run([str(VENV_PY), "-c", _RENDER], 120, cwd=str(tmp_path))
    assert p.returncode == 0 and "#SBATCH --nodes=2" in p.stdout, p.stdout[-2000:]
    no_torch = run([str(OPS_BIN / "python"), "-c", "import torch"], 60)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stdout
    ops = run([str(OPS_BIN / "uccl-ep-launch"), "slurm", "local/bench-cpu", "--dry-run"], 120, cwd=str(tmp_path))
    assert ops.returncode == 0 and ops.stdout == p.stdout, ops.stdout[-2000:]
