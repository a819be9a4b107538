"""uccl-ep-primus against Primus-Turbo's EP backend registry interface.

Primus-Turbo cannot be installed in CI (not on PyPI; built from source in ROCm images), so these
tests run against ``primus_turbo_standin/``, a stand-in of the documented registry interface
(its docstring lists what it reproduces). Two gloo ranks exercise the sync-free path Primus uses
(``num_worst_tokens``), cached dispatch and weighted combine, with exact checks against the
routing of all ranks.
"""

from __future__ import annotations

import os
import random
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "primus_turbo_standin")
PACKAGE = os.path.abspath(os.path.join(HERE, ".."))
for path in (PACKAGE, STANDIN, os.path.join(HERE, "..", "..", "..", "core", "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

from uccl_ep.errors import InvalidArgument, MissingDependency, Unsupported  # noqa: E402
from uccl_ep.spawn import run_ranks  # noqa: E402

REGISTRY = "primus_turbo.pytorch.kernels.moe.moe_dispatch_combine_impl"


@pytest.fixture
def registry(monkeypatch):
    import importlib

    module = importlib.import_module(REGISTRY)
    saved = dict(module._BACKEND_REGISTRY)
    module._backend_instances.clear()
    monkeypatch.setenv(module.ENV, "uccl")
    yield module
    module._BACKEND_REGISTRY.clear()
    module._BACKEND_REGISTRY.update(saved)
    module._backend_instances.clear()


def test_register_replaces_builtin_uccl_and_env_selects_it(registry):
    import uccl_ep_primus

    assert registry._BACKEND_REGISTRY["UCCL"] is not uccl_ep_primus.UcclEpBackend
    registry._get_backend_instance("UCCL")  # an idle instance of the built-in entry
    assert uccl_ep_primus.register() is uccl_ep_primus.UcclEpBackend
    assert uccl_ep_primus.register("uccl") is uccl_ep_primus.UcclEpBackend  # idempotent, name upper-cased
    backend = registry._get_backend_instance(registry.selected_name())
    assert isinstance(backend, uccl_ep_primus.UcclEpBackend) and not backend.is_initialized()
    assert backend.supports_cuda_graph() is False and backend.can_release(will_reinit=True)
    with pytest.raises(NotImplementedError):
        backend.tune_configs()


def test_register_refuses_to_replace_a_live_backend(registry):
    import uccl_ep_primus

    registry._get_backend_instance("UCCL")._buffer = object()
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
    rows = []
    for src in range(world):
        for t in range(xs[src].shape[0]):
            if any(rank * nle <= int(e) < (rank + 1) * nle for e in idxs[src][t]):
                rows.append((src, t))
    return rows


def _worker(rank, world, seed):
    """Both generations of init_buffer's arguments, one after the other (fresh buffer each)."""
    from primus_turbo.pytorch.kernels.moe import moe_dispatch_combine_impl as impl

    received = []
    for i, style in enumerate(("new", "old")):
        impl.INIT_STYLE = style
        if "UCCL" in impl._backend_instances:
            impl._backend_instances["UCCL"].release_buffer()
        try:
            received.append(_round_trip(rank, world, seed + i))
        except AssertionError as exc:
            raise AssertionError(f"init_buffer style {style}: {exc}") from None
    return received


def _round_trip(rank, world, seed):
    import torch
    import torch.distributed as dist

    import uccl_ep_primus
    from primus_turbo.pytorch.kernels.moe import moe_dispatch_combine_impl as impl

    os.environ[impl.ENV] = "UCCL"
    uccl_ep_primus.register()
    E, K, H, T = 8, 3, 32, 11
    nle = E // world
    gen = torch.Generator().manual_seed(seed * 31 + rank)
    x = torch.randint(-9, 10, (T, H), generator=gen).to(torch.bfloat16)  # Primus sizes for 2-byte rows
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
    backend = impl._get_backend_instance("UCCL")
    assert isinstance(backend, uccl_ep_primus.UcclEpBackend) and backend.is_initialized()

    again, *_ = impl.moe_dispatch_impl(2 * x, group, handle=handle)  # cached layout
    assert torch.equal(again[:n], 2 * recv_x[:n])

    combined, combined_w = impl.moe_combine_impl(recv_x, group, handle, topk_weights=recv_w)
    ranks_of = torch.zeros(T)
    for r in range(world):
        ranks_of += torch.tensor([any(r * nle <= int(e) < (r + 1) * nle for e in idx[t]) for t in range(T)]).float()
    assert torch.equal(combined, (x.float() * ranks_of.unsqueeze(1)).to(x.dtype)), "unweighted combine = x times receiving ranks"
    assert torch.equal(combined_w, w), "combined weights = the original weights"
    return n


def test_two_ranks_sync_free_dispatch_combine():
    seed = random.SystemRandom().randrange(1 << 30)
    try:
        received = run_ranks(_worker, 2, seed, timeout_s=120)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from None
    assert all(sum(r[i] for r in received) > 0 for i in range(2))
