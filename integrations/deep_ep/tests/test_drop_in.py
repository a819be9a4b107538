"""The ``deep_ep`` drop-in (deep-ep-uccl): the names DeepEP users import, its SGLang guard, and
Megatron-Core 0.19.2's unmodified deepep flex path importing it for real (no sys.modules alias).

The package is put on sys.path here rather than installed into the shared CI venv: it owns the
import name ``deep_ep``, which would change what other areas' tests see.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DROP_IN = os.path.abspath(os.path.join(HERE, ".."))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
MEGATRON_SRC = os.path.join(REPO, ".cache", "megatron-core-0.19.2")
CONTRACT_TESTS = os.path.join(REPO, "core", "tests", "cpu")


def run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([DROP_IN, MEGATRON_SRC, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_names_megatron_and_vllm_import():
    proc = run_python("""
        import deep_ep, uccl_ep
        from deep_ep import Buffer, Config, EventHandle, EventOverlap, topk_idx_t
        from deep_ep.utils import EventHandle as EH, EventOverlap as EO
        assert deep_ep.__file__.startswith(%r), deep_ep.__file__
        assert Buffer is uccl_ep.Buffer and Config is uccl_ep.Config and EH is EventHandle and EO is EventOverlap
        assert topk_idx_t is uccl_ep.topk_idx_t and deep_ep.__version__.endswith(uccl_ep.__version__)
        assert callable(Buffer.get_low_latency_rdma_size_hint) and callable(Buffer.set_num_sms)
        print("OK")
    """ % DROP_IN)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr[-2000:]


def test_guard_warns_beside_sglang(monkeypatch):
    sys.path.insert(0, DROP_IN)
    try:
        from deep_ep import _guard
    finally:
        sys.path.remove(DROP_IN)
    versions = {"sglang": "0.5.23"}

    def fake_version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(_guard.metadata, "version", fake_version)
    with pytest.warns(RuntimeWarning, match="sglang 0.5.23"):
        assert _guard.warn_if_beside_sglang()
    versions["sglang"] = "0.5.17"
    assert not _guard.warn_if_beside_sglang()  # older SGLang did not ship deep_ep
    versions["sgl-deep-ep"] = "0.1.2.post1"
    with pytest.warns(RuntimeWarning, match="sgl-deep-ep"):
        assert _guard.warn_if_beside_sglang()


def _megatron_worker(rank, world, seed):
    import deep_ep  # the drop-in, found on sys.path (inherited from the parent)
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.moe import fused_a2a
    from megatron.core.transformer.transformer_config import TransformerConfig

    import torch
    torch._dynamo.config.disable = True  # Megatron's jit_fuser; see the contract test
    assert deep_ep.__file__.startswith(DROP_IN) and fused_a2a.HAVE_DEEP_EP and fused_a2a.Buffer is deep_ep.Buffer
    from test_megatron_contract import check_flex_round_trip

    ps.initialize_model_parallel(expert_model_parallel_size=world)
    cfg = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, num_moe_experts=8, moe_router_topk=2,
                            moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep",
                            expert_model_parallel_size=world, moe_router_dtype="fp32", use_cpu_initialization=True,
                            add_bias_linear=False)
    return check_flex_round_trip(rank, world, seed, cfg, num_tokens=13, drop_fraction=0.0)


def test_megatron_deepep_backend_runs_on_the_drop_in():
    from uccl_ep.spawn import run_ranks

    added = [p for p in (DROP_IN, MEGATRON_SRC, CONTRACT_TESTS, os.path.join(REPO, "core", "tests")) if p not in sys.path]
    sys.path[:0] = added  # spawned ranks inherit sys.path
    seed = random.SystemRandom().randrange(1 << 30)
    try:
        results = run_ranks(_megatron_worker, 2, seed, timeout_s=180)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from None
    finally:
        for p in added:
            sys.path.remove(p)
    assert [r["manager"] for r in results] == ["_DeepepManager"] * 2
