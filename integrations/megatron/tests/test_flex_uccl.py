"""``--moe-flex-dispatcher-backend uccl`` end to end on 2 gloo ranks, from a real argv.

1. Megatron's own parse_args + validate_args + core_transformer_config_from_args turn the command
   line into a TransformerConfig; Megatron's MoEFlexTokenDispatcher then runs on uccl_ep (no
   ``deep_ep`` anywhere) and is checked bit-exactly, forward and backward, against the
   independent per-expert expectation of core/tests/cpu/test_megatron_contract.py (shared).
2. The GPU example (examples/train_moe_gpt.py) trains a tiny MoE GPT through Megatron's DDP,
   optimizer and schedule, once with flex/uccl and once with Megatron's allgather dispatcher
   (alltoall needs CUDA streams), from the same seed and data: fp32 losses must agree to rounding,
   and the run summary and the parity comparer (gpu/compare_runs.py) are exercised as on the GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys

import cpu_shims
import pytest

from uccl_ep.spawn import run_ranks

CONTRACT_TESTS = os.path.join(cpu_shims.REPO, "core", "tests", "cpu")
EXAMPLE = os.path.join(cpu_shims.INTEGRATION, "examples", "train_moe_gpt.py")
COMPARE = os.path.join(cpu_shims.INTEGRATION, "gpu", "compare_runs.py")

ARGV = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--num-experts", "8",
        "--moe-router-topk", "3", "--expert-model-parallel-size", "2", "--moe-router-dtype", "fp32",
        "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "uccl", "--uccl-backend", "{backend}",
        "--uccl-timeout-s", "60", "--uccl-num-sms", "24", "--use-cpu-initialization", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "1", "--disable-bias-linear",
        "--moe-expert-capacity-factor", "8.0"]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dispatcher_worker(rank, world, seed, backend, src=cpu_shims.MEGATRON_SRC):
    cpu_shims.add_paths(src)  # spawned ranks do not run conftest (typing.override on 3.11)
    import torch

    import uccl_ep
    import uccl_ep_megatron
    from uccl_ep_megatron import dispatch

    uccl_ep_megatron.install()
    torch._dynamo.config.disable = True  # Megatron's jit_fuser; see cpu_shims
    from megatron.core import parallel_state as ps
    from megatron.training import arguments

    sys.argv = ["pretrain_gpt.py", *(a.format(backend=backend) for a in ARGV)]
    args = arguments.parse_args()
    arguments.validate_args(args)
    cfg = arguments.core_transformer_config_from_args(args)
    assert (cfg.moe_flex_dispatcher_backend, cfg.moe_flex_dispatcher_num_sms) == ("uccl", 24)
    ps.initialize_model_parallel(expert_model_parallel_size=world)
    sys.path[:0] = [CONTRACT_TESTS, os.path.dirname(CONTRACT_TESTS)]  # the contract test and its multirank helper
    from test_megatron_contract import check_flex_round_trip

    results = [check_flex_round_trip(rank, world, seed + i, cfg, num_tokens=n, drop_fraction=f)
               for i, (n, f) in enumerate([(19, 0.0), (14, 0.4)])]
    buf = dispatch._buffer
    assert isinstance(buf, uccl_ep.Buffer) and buf.backend == backend and uccl_ep.Buffer.num_sms == 24
    assert "deep_ep" not in sys.modules, "the uccl backend must not need deep_ep"
    from megatron.core import package_info

    from uccl_ep_megatron.overlap import overlap_supported

    return {"managers": [r["manager"] for r in results], "megatron_core": package_info.__version__,
            "overlap_unsupported_because": overlap_supported()}


@pytest.mark.parametrize("backend,version", [("host", "0.19.2"), ("reference", "0.19.2"), ("host", "0.19.0")])
def test_uccl_backend_from_real_argv_exact(backend, version, executor_summary):
    # host: the real queue -> proxy -> transport path under Megatron's flex dispatcher; reference:
    # the oracle run. Both are checked against the independent per-expert expectation. 0.19.0 and
    # 0.19.2 are the oldest and newest release of the tested window.
    src = cpu_shims.MEGATRON_SRC if version == "0.19.2" else cpu_shims.MEGATRON_SRC_OLDEST
    seed = random.SystemRandom().randrange(1 << 30)
    try:
        out = run_ranks(_dispatcher_worker, 2, seed, backend, src, timeout_s=180)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from None
    assert [r["managers"] for r in out] == [["UcclManager"] * 2] * 2
    assert [r["megatron_core"].split("+")[0] for r in out] == [version] * 2
    # the EP-overlap wiring (test_ep_overlap.py) finds its Megatron functions in this release too
    assert [r["overlap_unsupported_because"] for r in out] == [None, None]
    executor_summary.append(f"Megatron-Core {version} MoEFlexTokenDispatcher (flex/uccl, fwd + bwd): {backend}")


TINY = ["--device", "cpu", "--precision", "fp32", "--clip-grad", "0", "--num-layers", "2", "--hidden-size", "64",
        "--ffn-hidden-size", "128", "--moe-ffn-hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--vocab-size", "128", "--micro-batch-size", "2",
        "--global-batch-size", "8", "--train-iters", "5", "--warmup-steps", "1", "--lr", "3e-3"]


def _train_worker(rank, world, out_dir):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    cpu_shims.add_paths()
    cpu_shims.cpu_training_shims()
    example = _load("train_moe_gpt", EXAMPLE)
    summaries = {}
    for name, extra in (("uccl", ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "uccl"]),
                        ("allgather", ["--moe-token-dispatcher-type", "allgather"])):
        summaries[name] = example.main(TINY + extra + ["--output-json", os.path.join(out_dir, name + ".json")])
        ps.destroy_model_parallel()
        dist.barrier()
    from uccl_ep_megatron import dispatch

    return {"losses": {k: v["losses"] for k, v in summaries.items()}, "executor": dispatch._buffer.backend}


def test_example_training_loop_uccl_matches_allgather(tmp_path, executor_summary):
    out = run_ranks(_train_worker, 2, str(tmp_path), timeout_s=300)
    assert [r["executor"] for r in out] == ["host", "host"], "backend=auto on CPU tensors is the host executor"
    executor_summary.append("Megatron training loop (train_moe_gpt.py, 5 steps, flex/uccl vs allgather): host")
    losses = [r["losses"] for r in out]
    assert losses[0] == losses[1], "every rank reports the DP-averaged loss"
    uccl, ref = losses[0]["uccl"], losses[0]["allgather"]
    assert len(uccl) == 5 and uccl[-1] < uccl[0], uccl
    for step, (a, b) in enumerate(zip(uccl, ref), start=1):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: uccl {a} vs allgather {b}"
    with open(tmp_path / "uccl.json") as f:
        summary = json.load(f)
    assert summary["config"]["dispatcher"] == "flex/uccl" and summary["config"]["ep"] == 2
    assert summary["losses"] == uccl and summary["tokens_per_s"] > 0
    compare = _load("compare_runs", COMPARE)
    report = tmp_path / "parity.json"
    assert compare.main([str(tmp_path / "allgather.json"), str(tmp_path / "uccl.json"), "--report", str(report)]) == 0
    assert json.loads(report.read_text())["match"]
    # the comparer must also catch a wrong curve
    summary["losses"] = [x + 0.5 for x in summary["losses"]]
    (tmp_path / "bad.json").write_text(json.dumps(summary))
    assert compare.main([str(tmp_path / "allgather.json"), str(tmp_path / "bad.json")]) == 1
