"""uccl-ep-primus against Primus-Turbo's EP backend registry, both upstream generations.

Primus-Turbo and Primus cannot be installed in CI (not on PyPI; built from source in ROCm
images), so these tests run against stand-ins of their interfaces: primus_turbo_standin/ (the EP
registry and backend manager, README.md there lists what each generation does) and
primus_standin/ (Primus's CLI entry: override parsing, the turbo DeepEP patch condition, the
token dispatcher's calls). Every multi-rank case runs on the host executor (the real queue ->
proxy -> transport path on CPU) with exact checks against the routing of all ranks.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "primus_turbo_standin")
PRIMUS_STANDIN = os.path.join(HERE, "primus_standin")
PACKAGE = os.path.abspath(os.path.join(HERE, ".."))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DROP_IN = os.path.join(REPO, "integrations", "deep_ep")
for path in (PACKAGE, STANDIN, os.path.join(REPO, "core", "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

from uccl_ep.errors import InvalidArgument, MissingDependency, Unsupported  # noqa: E402
from uccl_ep.spawn import run_ranks  # noqa: E402

REGISTRY = "primus_turbo.pytorch.kernels.moe.moe_dispatch_combine_impl"
ENV = "PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND"
GENERATIONS = ("a6a16cdc", "latest")


@pytest.fixture
def registry(monkeypatch):
    """The stand-in's default generation (latest) in this process, restored afterwards."""
    import importlib

    module = importlib.import_module(REGISTRY)
    from primus_turbo.pytorch.core.backend import GlobalBackendManager

    saved = dict(module._BACKEND_REGISTRY)
    module._backend_instances.clear()
    monkeypatch.setenv(ENV, "uccl")
    yield module
    module._BACKEND_REGISTRY.clear()
    module._BACKEND_REGISTRY.update(saved)
    module._backend_instances.clear()
    GlobalBackendManager.reset()


def test_register_replaces_builtin_uccl_and_env_selects_it(registry):
    import uccl_ep_primus

    assert registry._BACKEND_REGISTRY["UCCL"].__name__ == "UCCLEPBackend"  # uccl-project's, built in
    assert uccl_ep_primus.register() is uccl_ep_primus.UcclEpBackend
    assert uccl_ep_primus.register("uccl") is uccl_ep_primus.UcclEpBackend  # idempotent, name upper-cased
    assert uccl_ep_primus.check_selected() == "UCCL"
    backend = registry._get_backend_instance(registry._get_backend_name())
    assert isinstance(backend, uccl_ep_primus.UcclEpBackend) and not backend.is_initialized()
    assert backend.supports_cuda_graph() is False and backend.can_release(will_reinit=True)
    with pytest.raises(NotImplementedError):
        backend.tune_configs()


@pytest.mark.parametrize("value,words", [("TURBO", "05_using_uep.sh"), (None, "05_using_uep.sh")])
def test_overwritten_or_missing_variable_is_refused(registry, monkeypatch, value, words):
    import uccl_ep_primus

    if value is None:
        monkeypatch.delenv(ENV)
    else:
        monkeypatch.setenv(ENV, value)
    with pytest.raises(Unsupported, match=words) as err:
        uccl_ep_primus.activate()
    assert "TURBO" in str(err.value) and ENV in str(err.value)


def test_code_level_manager_setting_is_named(registry):
    import uccl_ep_primus
    from primus_turbo.pytorch.core.backend import BackendType, GlobalBackendManager

    GlobalBackendManager.set_moe_dispatch_combine_backend(BackendType.TURBO)
    with pytest.raises(Unsupported, match="GlobalBackendManager.set_moe_dispatch_combine_backend"):
        uccl_ep_primus.activate()


def test_register_refuses_to_replace_a_live_backend(registry):
    import uccl_ep_primus

    live = registry._BACKEND_REGISTRY["DEEP_EP"]()
    live._buffer = object()
    registry._backend_instances["UCCL"] = live
    with pytest.raises(Unsupported, match="live buffer"):
        uccl_ep_primus.register()


def test_missing_or_old_primus_turbo_is_explained(monkeypatch):
    import types

    import uccl_ep_primus

    monkeypatch.setitem(sys.modules, REGISTRY, None)  # import fails
    with pytest.raises(MissingDependency, match="Primus-Turbo"):
        uccl_ep_primus.register()
    with pytest.raises(Unsupported, match="register_ep_backend"):
        uccl_ep_primus.register(registry=types.ModuleType("old_primus_turbo"))


def test_argument_errors():
    from uccl_ep_primus import UcclEpBackend

    backend = UcclEpBackend()
    with pytest.raises(InvalidArgument, match="init_buffer"):
        backend.init_buffer(None)
    with pytest.raises(InvalidArgument, match="initialized backend before dispatch"):
        backend.dispatch(None)
    with pytest.raises(InvalidArgument, match="setup_env"):
        backend.setup_env(UCCL_IB_HCA="mlx5_0")
    backend.setup_env(UCCL_IB_HCA=None)


def _expected_rows(rank, world, nle, xs, idxs):
    return [(src, t) for src in range(world) for t in range(xs[src].shape[0])
            if any(rank * nle <= int(e) < (rank + 1) * nle for e in idxs[src][t])]


def _round_trip_worker(rank, world, seed, route):
    """One sync-free dispatch, the cached (backward) dispatch and the combine through the stand-in's
    moe_dispatch_impl / moe_combine_impl, with uccl_ep_primus (route "UCCL") or the deep_ep drop-in
    (route "DEEP_EP") underneath."""
    for path in (PACKAGE, STANDIN) + ((DROP_IN,) if route == "DEEP_EP" else ()):
        sys.path.insert(0, path)
    import torch
    import torch.distributed as dist

    import uccl_ep
    from primus_turbo.pytorch.kernels.moe import moe_dispatch_combine_impl as impl

    os.environ[ENV] = route
    if route == "UCCL":
        import uccl_ep_primus

        assert uccl_ep_primus.activate() == "UCCL"
    else:
        import uccl_ep_primus

        assert uccl_ep_primus.check_selected() == "DEEP_EP"  # accepted: deep_ep is the drop-in
    E, K, H, T = 8, 3, 32, 11
    nle = E // world
    gen = torch.Generator().manual_seed(seed * 31 + rank)
    x = torch.randint(-9, 10, (T, H), generator=gen).to(torch.bfloat16)
    idx = torch.rand(T, E, generator=gen).argsort(dim=1)[:, :K].long().contiguous()
    idx[torch.rand(T, K, generator=gen) < 0.2] = -1  # dropped selections
    w = torch.randint(1, 9, (T, K), generator=gen).float() / 8 * (idx >= 0)
    xs, idxs = [None] * world, [None] * world
    dist.all_gather_object(xs, x)
    dist.all_gather_object(idxs, idx)
    group = dist.group.WORLD
    worst = T * world
    recv_x, recv_idx, recv_w, counts, handle = impl.moe_dispatch_impl(
        x, group, topk_idx=idx, token_weights=w, num_experts=E, async_finish=True, allocate_on_comm_stream=True,
        num_worst_tokens=worst)
    rows = _expected_rows(rank, world, nle, xs, idxs)
    n = len(rows)
    assert recv_x.shape == (worst, H) and recv_idx.shape == (worst, K), (recv_x.shape, recv_idx.shape)
    for i, (src, t) in enumerate(rows):
        assert torch.equal(recv_x[i], xs[src][t]), (i, src, t)
        local = idxs[src][t] - rank * nle
        mine = (local >= 0) & (local < nle)
        assert torch.equal(recv_idx[i], torch.where(mine, local, torch.full_like(local, -1))), (i, recv_idx[i])
    assert bool((recv_idx[n:] == -1).all()), "padding rows must carry no expert"
    again, *_ = impl.moe_dispatch_impl(2 * x, group, handle=handle)  # cached layout
    assert torch.equal(again[:n], 2 * recv_x[:n])
    combined, combined_w = impl.moe_combine_impl(recv_x, group, handle, topk_weights=recv_w)
    ranks_of = torch.zeros(T)
    for r in range(world):
        ranks_of += torch.tensor([any(r * nle <= int(e) < (r + 1) * nle for e in idx[t]) for t in range(T)]).float()
    assert torch.equal(combined, (x.float() * ranks_of.unsqueeze(1)).to(x.dtype)), "combine = x times receiving ranks"
    assert torch.equal(combined_w, w), "combined weights = the original weights"
    backend = impl._backend_instances[impl._get_backend_name()]
    assert isinstance(backend._buffer, uccl_ep.Buffer)
    return {"rows": n, "class": type(backend).__name__, "executor": backend._buffer.backend}


@pytest.mark.parametrize("generation,route", [("latest", "UCCL"), ("a6a16cdc", "DEEP_EP"), ("latest", "DEEP_EP")])
def test_two_ranks_sync_free_dispatch_combine(generation, route):
    seed = random.SystemRandom().randrange(1 << 30)
    try:
        out = run_ranks(_round_trip_worker, 2, seed, route, timeout_s=180, env={"PRIMUS_TURBO_STANDIN": generation})
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from None
    want = "UcclEpBackend" if route == "UCCL" else "DeepEPBackend"
    assert [r["class"] for r in out] == [want, want] and [r["executor"] for r in out] == ["host", "host"]


def _refused_worker(rank, world):
    sys.path[:0] = [PACKAGE, STANDIN]
    import uccl_ep_primus

    os.environ[ENV] = "UCCL"
    try:
        uccl_ep_primus.activate()
    except Unsupported as exc:
        return str(exc)
    return None


def test_uccl_name_on_the_earlier_registry_is_refused_not_turbo():
    # The earlier registry reads the variable through BackendType (TURBO, DEEP_EP): UCCL would
    # silently run TURBO there. activate() must say so and point at the DEEP_EP route.
    msgs = run_ranks(_refused_worker, 1, timeout_s=120, env={"PRIMUS_TURBO_STANDIN": "a6a16cdc"})
    assert msgs[0] is not None and "falls back to TURBO" in msgs[0] and "DEEP_EP" in msgs[0]


# ---- a rendered recipe, executed ----------------------------------------------------------------
def _render(recipe: str, overrides: list[str]):
    from uccl_ep_deploy import catalog
    from uccl_ep_deploy.frameworks import build_plan
    from uccl_ep_deploy.local import local_commands
    from uccl_ep.spawn import free_port

    plan = build_plan(catalog.load(recipe, overrides))
    [(argv, env)] = local_commands(plan, "127.0.0.1", free_port())
    return argv, env


def _run_rendered(tmp_path, generation, backend_value=None, with_drop_in=False):
    """Render recipes/primus/deepseek-v3-mi300x-cx7.toml for one node of 2 ranks and run it with the
    Primus and Primus-Turbo stand-ins in place of /workspace/Primus (its experiment file, its entry).
    ``backend_value``: what a runner hook left in the variable after rendering (None: the recipe's)."""
    argv, env = _render("primus/deepseek-v3-mi300x-cx7",
                        ["cluster.nodes=1", "cluster.gpus_per_node=2", "args.expert_model_parallel_size=2",
                         "args.train_iters=2"])
    exp = tmp_path / "examples/megatron/configs/MI300X/deepseek_v3-BF16-pretrain.yaml"
    exp.parent.mkdir(parents=True, exist_ok=True)
    exp.write_text("# the experiment file must exist (Primus reads it)\n")
    entry = os.path.join(PRIMUS_STANDIN, "primus", "cli", "main.py")
    argv = [sys.executable if a == "python3" else entry if a == "/workspace/Primus/primus/cli/main.py" else a
            for a in argv]
    full = dict(os.environ)
    full.update(env)
    if backend_value is not None:
        full[ENV] = backend_value
    paths = [PACKAGE, STANDIN, PRIMUS_STANDIN] + ([DROP_IN] if with_drop_in else [])
    full["PYTHONPATH"] = os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")])
    full["PRIMUS_TURBO_STANDIN"] = generation
    for var in ("UCCL_EP_FABRIC_PROVIDER", "UCCL_EP_NUM_PROXY_THREADS"):
        full.pop(var, None)  # the platform's NIC settings; this CPU host runs the loop transport
    proc = subprocess.run(argv, cwd=tmp_path, env=full, capture_output=True, text=True, timeout=240)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"rank"')]
    return proc, argv, lines


def test_rendered_recipe_runs_primus_turbo_dispatch_on_uccl_ep(tmp_path):
    proc, argv, lines = _run_rendered(tmp_path, "latest")
    assert argv[argv.index("-m", 3):argv.index("-m", 3) + 2] == ["-m", "uccl_ep_primus"]
    assert {"--enable_primus_turbo", "--use_turbo_deepep"} <= set(argv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(r["rank"] for r in lines) == [0, 1]
    for r in lines:
        assert (r["backend_name"], r["backend_class"], r["buffer"]) == ("UCCL", "UcclEpBackend", "uccl_ep.buffer.Buffer")
        assert r["executor"] == "host" and r["num_sms"] == 32  # [buffers] num_sms -> --turbo_deepep_num_cu


@pytest.mark.parametrize("value", ["TURBO", "DEEP_EP"])
def test_rendered_recipe_fails_when_a_hook_overwrites_the_variable(tmp_path, value):
    # Primus's runner hook 05_using_uep.sh exports TURBO (USING_UEP unset) or DEEP_EP (USING_UEP=1,
    # with uccl-project's deep_ep): the job must stop before training, saying why.
    proc, _, lines = _run_rendered(tmp_path, "latest", backend_value=value)
    assert proc.returncode != 0 and lines == []
    assert f"{ENV}={value!r}" in proc.stderr and "uccl-ep-primus: error" in proc.stderr, proc.stderr[-3000:]


def test_rendered_recipe_with_the_deep_ep_route_on_the_earlier_registry(tmp_path):
    proc, _, lines = _run_rendered(tmp_path, "a6a16cdc", backend_value="DEEP_EP", with_drop_in=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [(r["backend_name"], r["backend_class"], r["executor"]) for r in lines] == [("DEEP_EP", "DeepEPBackend",
                                                                                       "host")] * 2
