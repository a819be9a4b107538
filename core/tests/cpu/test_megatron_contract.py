"""Contract test: Megatron-Core 0.19.2's real flex dispatcher runs on uccl_ep in place of deep_ep.

Megatron's `MoEFlexTokenDispatcher` (backend "deepep") -> `_DeepepManager` -> `fused_a2a.FusedDispatch /
FusedCombine` is driven exactly as a MoE layer drives it, on 2 gloo ranks, with ``deep_ep`` bound to
``uccl_ep`` (sys.modules alias, before Megatron imports it). Nothing of Megatron is patched.

Each rank's "experts" apply a known per-expert function f_e(h) = (e + 1) * h + e to the rows they
receive, times the routing weight, so the whole round trip has an independent expectation computed
from the rank's own inputs:

    out[t]          = sum_k w[t, k] * f_{e_k}(x[t])            (over selections not masked to -1)
    x.grad[t]       = sum_k w[t, k] * (e_k + 1) * g[t]         for an upstream grad g
    probs.grad[t,e] = <f_e(x[t]), g[t]>                          for each selected e, else 0

Inputs are small integers and dyadic weights, so every value is exact in fp32 and the checks are
bit-exact (``rtol=atol=0``). Per-local-expert receive counts are checked against the routing of all
ranks. Inputs are fresh random draws each run (the seed is in the failure message).

Needs the Megatron-Core 0.19.2 sources that ``ci/setup.sh --test`` unpacks into .cache/.
"""

from __future__ import annotations

import os
import random
import sys

import pytest

from multirank import run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MEGATRON_SRC = os.path.join(REPO, ".cache", "megatron-core-0.19.2")


def _expert_fn(h, e: int):
    return (e + 1) * h + e


def _worker(rank: int, world: int, seed: int, cases: list) -> list:
    import torch

    import uccl_ep
    import uccl_ep.utils

    # NOTES: the alias must exist before Megatron imports fused_a2a (it binds deep_ep names at import).
    sys.modules["deep_ep"] = uccl_ep
    sys.modules["deep_ep.utils"] = uccl_ep.utils
    # NOTES: Megatron wraps dispatch_preprocess in torch.compile (jit_fuser); compiling it costs
    # ~10 s per process on the 2-core CI machine and changes nothing this test checks.
    torch._dynamo.config.disable = True
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.moe import fused_a2a

    assert fused_a2a.HAVE_DEEP_EP and fused_a2a.Buffer is uccl_ep.Buffer
    ps.initialize_model_parallel(expert_model_parallel_size=world)
    results = []
    for i, case in enumerate(cases):
        try:
            results.append(_round_trip(rank, world, seed + 7919 * i, **case))
        except AssertionError as exc:
            raise AssertionError(f"case {case}: {exc}") from None
    # Megatron built its one Buffer through deep_ep's name: it must be uccl_ep's.
    assert isinstance(fused_a2a._buffer, uccl_ep.Buffer), type(fused_a2a._buffer)
    return results


def _round_trip(rank: int, world: int, seed: int, num_experts: int, topk: int, hidden: int, num_tokens: int,
                drop_fraction: float) -> dict:
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=4, num_moe_experts=num_experts,
                            moe_router_topk=topk, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep",
                            expert_model_parallel_size=world, moe_router_dtype="fp32", use_cpu_initialization=True,
                            add_bias_linear=False,
                            # a capacity factor makes Megatron mask zero-weight selections with -1
                            moe_expert_capacity_factor=8.0 if drop_fraction else None)
    return check_flex_round_trip(rank, world, seed, cfg, num_tokens, drop_fraction)


def check_flex_round_trip(rank: int, world: int, seed: int, cfg, num_tokens: int, drop_fraction: float) -> dict:
    """Drive Megatron's MoEFlexTokenDispatcher built from ``cfg`` and check it bit-exactly (see the
    module docstring). Shared with integrations/megatron/tests (backend "uccl")."""
    import torch
    import torch.distributed as dist
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection
    from megatron.core.transformer.moe.token_dispatcher import MoEFlexTokenDispatcher

    num_experts, topk, hidden = cfg.num_moe_experts, cfg.moe_router_topk, cfg.hidden_size
    nle = num_experts // world
    dispatcher = MoEFlexTokenDispatcher(nle, list(range(rank * nle, (rank + 1) * nle)), cfg,
                                        pg_collection=get_default_pg_collection())

    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randint(-8, 9, (num_tokens, hidden), generator=gen).float().requires_grad_()
    chosen = torch.rand(num_tokens, num_experts, generator=gen).argsort(dim=1)[:, :topk]
    weights = torch.randint(1, 5, (num_tokens, topk), generator=gen).float() / 4  # 0.25 .. 1.0
    if drop_fraction:
        # dropped selections: weight 0 -> Megatron turns them into expert id -1
        weights[torch.rand(num_tokens, topk, generator=gen) < drop_fraction] = 0
    probs = torch.zeros(num_tokens, num_experts).scatter_(1, chosen, weights).requires_grad_()
    routing_map = probs.detach() > 0

    h, p = dispatcher.dispatch_preprocess(x, routing_map, probs)
    h, p = dispatcher.token_dispatch(h, p)
    h, tokens_per_expert, p = dispatcher.dispatch_postprocess(h, p)
    counts = tokens_per_expert.tolist()
    assert sum(counts) == h.shape[0], (counts, h.shape)
    pieces, start = [], 0
    for j, n in enumerate(counts):
        pieces.append(_expert_fn(h[start:start + n], rank * nle + j))
        start += n
    h = torch.cat(pieces) * p.unsqueeze(-1)
    out = dispatcher.combine_postprocess(dispatcher.token_combine(dispatcher.combine_preprocess(h)))
    grad = torch.randint(-4, 5, (num_tokens, hidden), generator=gen).float()
    out.backward(grad)

    # independent expectations from this rank's own inputs
    xd = x.detach()
    want_out = torch.zeros_like(xd)
    want_xgrad = torch.zeros_like(xd)
    want_pgrad = torch.zeros(num_tokens, num_experts)
    for t in range(num_tokens):
        for k in range(topk):
            e, w = int(chosen[t, k]), float(weights[t, k])
            if w == 0:
                continue
            want_out[t] += w * _expert_fn(xd[t], e)
            want_xgrad[t] += w * (e + 1) * grad[t]
            want_pgrad[t, e] = (_expert_fn(xd[t], e) * grad[t]).sum()
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, want_xgrad, rtol=0, atol=0)
    torch.testing.assert_close(probs.grad, want_pgrad, rtol=0, atol=0)

    maps = [None] * world
    dist.all_gather_object(maps, routing_map, group=dist.group.WORLD)
    want_counts = torch.stack(maps).sum(dim=(0, 1))[rank * nle:(rank + 1) * nle].tolist()
    assert counts == want_counts, (counts, want_counts)
    return {"counts": counts, "manager": type(dispatcher._comm_manager).__name__}


@pytest.fixture(scope="module", autouse=True)
def _megatron_on_path():
    if not os.path.isdir(os.path.join(MEGATRON_SRC, "megatron", "core")):
        pytest.fail(f"Megatron-Core 0.19.2 sources missing at {MEGATRON_SRC}: run `ci/setup.sh --test`")
    sys.path.insert(0, MEGATRON_SRC)  # spawned ranks inherit sys.path
    yield
    sys.path.remove(MEGATRON_SRC)
    sys.modules.pop("deep_ep", None)


CASES = [
    dict(num_experts=8, topk=2, hidden=16, num_tokens=24, drop_fraction=0.0),  # dropless
    dict(num_experts=8, topk=3, hidden=32, num_tokens=17, drop_fraction=0.3),  # some selections -1, odd count
    dict(num_experts=4, topk=4, hidden=16, num_tokens=9, drop_fraction=0.0),   # every token to every expert
]


def test_megatron_flex_dispatcher_round_trip_and_backward_exact():
    seed = random.SystemRandom().randrange(1 << 30)
    try:
        results = run_ranks(_worker, 2, seed, CASES, timeout_s=240)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from None
    for rank_results in results:
        assert len(rank_results) == len(CASES)
        assert all(r["manager"] == "_DeepepManager" for r in rank_results)
    assert all(sum(sum(r[i]["counts"]) for r in results) > 0 for i in range(len(CASES)))
