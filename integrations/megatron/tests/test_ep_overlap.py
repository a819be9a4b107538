"""``--overlap-moe-expert-parallel-comm`` with ``--moe-flex-dispatcher-backend uccl`` on 2 gloo ranks.

The GPU example's model (bf16, as the overlap requires) runs one global batch through Megatron's
own EP-overlap schedule (combined 1F1B: one micro-batch's forward beside another's backward, each
layer split into schedule nodes) on uccl_ep's host executor, and again, from the same seed and
data, through the plain 1F1B schedule. Losses and every parameter's gradient must be equal:
the overlap changes when work runs, not what it computes.
"""

from __future__ import annotations

import importlib.util
import os

import cpu_shims
import pytest

from uccl_ep.spawn import run_ranks

EXAMPLE = os.path.join(cpu_shims.INTEGRATION, "examples", "train_moe_gpt.py")

TINY_BF16 = ["--device", "cpu", "--precision", "bf16", "--clip-grad", "0", "--num-layers", "2", "--hidden-size",
             "64", "--ffn-hidden-size", "128", "--moe-ffn-hidden-size", "64", "--num-attention-heads", "4",
             "--seq-length", "32", "--max-position-embeddings", "32", "--vocab-size", "128", "--micro-batch-size", "2",
             "--global-batch-size", "12", "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
             "uccl"]


def _overlap_worker(rank, world):
    import torch
    import torch.distributed as dist

    cpu_shims.add_paths()
    cpu_shims.cpu_training_shims()
    spec = importlib.util.spec_from_file_location("train_moe_gpt", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from megatron.core import parallel_state as ps
    from megatron.core.models.common import fine_grained_callables
    from megatron.core.pipeline_parallel import schedules

    import uccl_ep_megatron
    from uccl_ep_megatron import dispatch

    uccl_ep_megatron.install()
    # Count what ran: Megatron's overlap schedule, and the layer callables built for uccl.
    calls = {"combined_1f1b": 0, "layer_callables": 0}
    overlap_schedule = schedules.combined_1f1b_schedule_for_no_pipelining
    build_callables = fine_grained_callables.build_transformer_layer_callables

    def counted_schedule(*a, **k):
        calls["combined_1f1b"] += 1
        return overlap_schedule(*a, **k)

    def counted_build(layer):
        calls["layer_callables"] += 1
        return build_callables(layer)

    schedules.combined_1f1b_schedule_for_no_pipelining = counted_schedule
    fine_grained_callables.build_transformer_layer_callables = counted_build
    runs = {}
    for name, extra in (("overlap", ["--overlap-moe-expert-parallel-comm"]), ("plain", [])):
        args = example.parse(TINY_BF16 + extra)
        example.init_distributed(args)
        config, model, _ = example.build(args, with_optimizer=False)
        assert config.overlap_moe_expert_parallel_comm is bool(extra) and config.bf16
        losses = example.forward_backward(args, config, model, example.micro_batches(args, 1, torch.device("cpu")))
        runs[name] = ([float(x["lm loss"]) for x in losses],
                      {n: p.main_grad.clone() for n, p in model.named_parameters()})
        ps.destroy_model_parallel()
        dist.barrier()
    (loss_o, grads_o), (loss_p, grads_p) = runs["overlap"], runs["plain"]
    return {"losses": [loss_o, loss_p], "calls": calls, "executor": dispatch._buffer.backend,
            "grads_equal": sorted(n for n in grads_p if torch.equal(grads_o[n], grads_p[n])),
            "params": sorted(grads_p), "grads_nonzero": all(bool(g.abs().sum() > 0) for g in grads_p.values())}


def test_overlap_schedule_runs_on_uccl_and_matches_plain_1f1b(executor_summary):
    out = run_ranks(_overlap_worker, 2, timeout_s=300)
    for res in out:
        loss_o, loss_p = res["losses"]
        assert len(loss_o) == 3 and loss_o == loss_p, res["losses"]
        assert res["grads_equal"] == res["params"] and res["grads_nonzero"]
        # the overlap run went through Megatron's combined 1F1B schedule, 2 layers x 3 micro-batches
        assert res["calls"] == {"combined_1f1b": 1, "layer_callables": 6}, res["calls"]
        assert res["executor"] == "host"
    executor_summary.append("Megatron-Core 0.19.2 --overlap-moe-expert-parallel-comm (combined 1F1B, flex/uccl, "
                            "bf16) vs plain 1F1B: host")


def test_overlap_refused_with_the_reason_where_the_schedule_is_not_covered(hook, monkeypatch):
    from megatron.core.transformer.transformer_config import TransformerConfig

    from uccl_ep.errors import Unsupported
    from uccl_ep_megatron import overlap

    base = dict(num_layers=1, hidden_size=16, num_attention_heads=4, num_moe_experts=4, moe_router_topk=2,
                use_cpu_initialization=True, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="uccl",
                expert_model_parallel_size=2, bf16=True)
    assert overlap.overlap_supported() is None
    cfg = TransformerConfig(**base, overlap_moe_expert_parallel_comm=True)
    assert cfg.overlap_moe_expert_parallel_comm
    # a Megatron whose overlap schedule is laid out otherwise: a typed error naming flag and reason
    overlap.unpatch_overlap_schedule()
    from megatron.core.models.common import utils as common_utils
    monkeypatch.delattr(common_utils, "should_free_input")
    assert not overlap.patch_overlap_schedule()
    with pytest.raises(Unsupported) as info:
        TransformerConfig(**base, overlap_moe_expert_parallel_comm=True)
    message = str(info.value)
    assert "overlap_moe_expert_parallel_comm" in message and "should_free_input" in message, message
    monkeypatch.undo()
    assert overlap.patch_overlap_schedule() and overlap.overlap_supported() is None
