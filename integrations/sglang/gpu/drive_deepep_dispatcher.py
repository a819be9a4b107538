"""Drive SGLang's own DeepEP dispatcher (normal, low-latency, auto) on uccl_ep, against a torch MoE.

Per rank (2 by default, one process each):
  1. SGLang's plugins are loaded with UCCL_EP_SGLANG=1 (as in a scheduler process after
     `--moe-a2a-backend uccl`), so `token_dispatcher/deepep.py` uses uccl_ep's Buffer and Config;
  2. `DeepEPDispatcher(group, ...)` is built for each `--deepep-mode` (normal, low_latency, auto),
     with and without a `--deepep-config` JSON; it dispatches random BF16 tokens with top-k routing
     through SGLang's `_DeepEPDispatcherImplNormal` / `_DeepEPDispatcherImplLowLatency` (buffer
     sizing, num_qps_per_rank, async_finish events, receive hooks, expert_alignment, the
     normal -> low-latency buffer clean); each rank applies its local experts
     (y_e(x) = tanh(x) * a_e: weighted per token in normal mode, unweighted per expert slab in
     low-latency mode, as SGLang's DeepGEMM runners do); `combine` returns the MoE output,
     compared with a torch reference of the whole MoE.

    python drive_deepep_dispatcher.py --device cuda          # GPU machine, 2 GPUs (NCCL group)
    python drive_deepep_dispatcher.py --device cpu           # CPU (CI): gloo group, host executor
    python drive_deepep_dispatcher.py --device cpu --backend reference   # the semantic oracle

Set as SGLang itself would on an SM90 GPU with DeepGEMM: `deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM`
(normal-mode combine refuses to run without it; it also makes dispatch align experts to 128).
Dispatch is BF16 (`--deepep-dispatcher-output-dtype bf16`): FP8 needs sglang-kernel's quantizer.
The server args come from `prepare_server_args([... "--moe-a2a-backend", "uccl" ...])` + resolution +
publish in each rank (model dir: a tiny Qwen3-MoE config.json), as in a scheduler process. SGLang
0.5.19+ (runtime_context API); the older releases are covered by the CPU resolution tests.
CPU runs only: `torch.cuda.get_device_properties` (SM count for a log line) answers a constant.
Two-batch overlap (`--enable-two-batch-overlap`): SGLang's MaybeTboDeepEPDispatcher with two
sub-batches on one buffer, stages in the order of SGLang's TBO decode strategy, low-latency and auto
mode. Not exercised: FP8 dispatch, CUDA graphs, DeepGEMM itself. Prints one JSON line
per rank and a PASS/FAIL line; exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

_EXPERT_SEED = 1234
DEEPEP_CONFIG = ('{"normal_dispatch": {"num_sms": 24, "num_max_nvl_chunked_send_tokens": 8, '
                 '"num_max_nvl_chunked_recv_tokens": 256, "num_max_rdma_chunked_send_tokens": 6, '
                 '"num_max_rdma_chunked_recv_tokens": 128}, "normal_combine": {"num_sms": 24, '
                 '"num_max_nvl_chunked_send_tokens": 6, "num_max_nvl_chunked_recv_tokens": 256, '
                 '"num_max_rdma_chunked_send_tokens": 6, "num_max_rdma_chunked_recv_tokens": 128}}')
# (deepep_mode, batch kinds run in order: True = extend/prefill batch, False = decode batch, config,
#  two-batch overlap)
SCENARIOS = (
    ("normal", (True,), "", False),
    ("normal", (True,), DEEPEP_CONFIG, False),
    ("low_latency", (False, False), "", False),
    ("auto", (True, False, True, False), "", False),
    ("low_latency", (False, False), "", True),
    ("auto", (True, False), "", True),
)


def _load_plugin() -> str:
    from importlib import metadata
    if any(ep.value.startswith("uccl_ep_sglang.") for ep in metadata.entry_points(group="sglang.srt.plugins")):
        from sglang.srt.plugins import load_plugins
        load_plugins()
        return "entry point (sglang.srt.plugins.load_plugins)"
    from sglang.srt.plugins.hook_registry import HookRegistry
    from uccl_ep_sglang.plugin import register
    register()
    # NOTES: load_plugins() applies the registered hooks after running the plugins; without the
    # entry point we do both steps ourselves.
    HookRegistry.apply_hooks()
    return "uccl_ep_sglang.plugin.register() + HookRegistry.apply_hooks() (entry point not installed here)"


def _tensors(rank: int, step: int, tokens: int, hidden: int, num_experts: int, topk: int, device):
    import torch
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    w, ids = torch.topk(torch.randn(tokens, num_experts, generator=g).softmax(-1), topk, dim=-1)
    return x.to(device), (w / w.sum(-1, keepdim=True)).float().to(device), ids.to(torch.int32).to(device)


def _run_batch(dispatcher, is_extend: bool, rank, world, x, w, ids, scales, num_local):
    from sglang.srt.runtime_context import get_forward

    with get_forward().scoped(is_extend_in_batch=is_extend):  # what a forward batch sets
        return _dispatch_experts_combine(dispatcher, is_extend, rank, x, w, ids, scales, num_local)


def _apply_experts(out, is_extend, mode, rank, scales, num_local):
    """The MoE experts on one dispatch output, as SGLang's DeepGEMM runners lay it out."""
    import torch
    from sglang.srt.layers.moe.token_dispatcher.deepep import DeepEPLLCombineInput, DeepEPNormalCombineInput

    if is_extend or mode == "normal":
        # normal: rows are received tokens, topk_ids are local expert ids (-1 = not here)
        y = torch.tanh(out.hidden_states.float())
        fused = torch.zeros_like(y)
        for k in range(out.topk_ids.shape[1]):
            lid = out.topk_ids[:, k].long()
            a = scales[(rank * num_local + lid.clamp(min=0))]
            fused += torch.where((lid >= 0).unsqueeze(1), out.topk_weights[:, k:k + 1] * y * a, 0.0)
        return DeepEPNormalCombineInput(fused.to(torch.bfloat16), out.topk_ids, out.topk_weights)
    y = torch.zeros_like(out.hidden_states)
    for e in range(num_local):
        n = int(out.masked_m[e])
        y[e, :n] = (torch.tanh(out.hidden_states[e, :n].float()) * scales[rank * num_local + e]).to(y.dtype)
    return DeepEPLLCombineInput(y, out.topk_ids, out.topk_weights)


def _dispatch_experts_combine(dispatcher, is_extend, rank, x, w, ids, scales, num_local):
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    out = dispatcher.dispatch(x, StandardTopKOutput(w, ids, None))
    return dispatcher.combine(_apply_experts(out, is_extend, dispatcher.deepep_mode.value, rank, scales, num_local))


def _run_tbo_batch(dispatcher, mode, is_extend, rank, x, w, ids, scales, num_local):
    """Two-batch overlap as SGLang's TBO schedule runs it: the batch split in two sub-batches on one
    MaybeTboDeepEPDispatcher (two inner DeepEP dispatchers, one process-wide buffer), each stage
    called with its `tbo_subbatch_index`, in the order of SGLang's decode strategy
    (operations_strategy.py, `tbo_delta_stages=2`: sub-batch 1 runs two stages behind sub-batch 0).

    NOTES: in that order the communication ops of the two sub-batches alternate (a's `_a` and `_b`
    halves enclose the other sub-batch's compute, not its communication), which is what keeps at
    most two low-latency ops in flight across ranks: the buffer's two sets are shared by dispatch
    and combine, as in DeepEP. Issuing a third op before a peer has received the first lets that
    peer's count signals and rows land on a set it has not read yet (a test order that did so failed
    here intermittently, as it would with DeepEP)."""
    import torch
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.runtime_context import get_forward

    half = x.shape[0] // 2
    parts = [(x[:half], w[:half], ids[:half]), (x[half:], w[half:], ids[half:])]
    ys = [None, None]

    def stage_dispatch_a(i):
        xi, wi, ii = parts[i]
        dispatcher.dispatch_a(hidden_states=xi, topk_output=StandardTopKOutput(wi, ii, None), tbo_subbatch_index=i)

    def stage_experts(i):
        out = dispatcher.dispatch_b(tbo_subbatch_index=i)
        dispatcher.combine_a(combine_input=_apply_experts(out, is_extend, mode, rank, scales, num_local),
                             tbo_subbatch_index=i)

    def stage_combine_b(i):
        ys[i] = dispatcher.combine_b(tbo_subbatch_index=i)

    # one layer's MoE stages, sub-batch 1 two stages behind sub-batch 0 (its earlier stages are
    # attention and gating, which have no communication here)
    schedule = [(0, stage_dispatch_a), (0, stage_experts), (0, stage_combine_b),
                (1, stage_dispatch_a), (1, stage_experts), (1, stage_combine_b)]
    with get_forward().scoped(is_extend_in_batch=is_extend):
        for i, stage in schedule:
            stage(i)
    return torch.cat(ys)


def _reference(x, w, ids, scales):
    import torch
    y = torch.tanh(x.float())
    return sum(w[:, k:k + 1] * y * scales[ids[:, k].long()] for k in range(ids.shape[1]))


def _publish_server_args(model_dir: str, world: int, device_kind: str) -> str:
    """Parse and resolve `--moe-a2a-backend uccl` as the launcher does, publish it as a scheduler does."""
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.server_args import prepare_server_args, set_global_server_args_for_scheduler

    sa = prepare_server_args(["--model-path", model_dir, "--tp", str(world), "--moe-a2a-backend", "uccl",
                              "--deepep-mode", "auto", "--deepep-dispatcher-output-dtype", "bf16",
                              "--load-format", "dummy", "--skip-tokenizer-init", "--device", device_kind])
    sa.resolve_once()
    set_global_server_args_for_scheduler(sa)
    initialize_moe_config()
    return sa.moe_a2a_backend


def rank_main(rank: int, world: int, device_kind: str, tokens: int, hidden: int, num_experts: int,
              topk: int, model_dir: str) -> dict:
    import os

    import torch
    import torch.distributed as dist
    import uccl_ep
    from uccl_ep.utils import calc_diff

    how = _load_plugin()
    if device_kind == "cpu":
        import types
        torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(multi_processor_count=132)
    resolved = _publish_server_args(model_dir, world, device_kind)
    import sglang.srt.layers.moe.token_dispatcher.deepep as dm
    from sglang.srt.layers.moe.utils import DeepEPMode
    from sglang.srt.runtime_context import get_flags, get_resources

    dm.deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM = True
    device = torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda" else torch.device("cpu")
    group = dist.group.WORLD  # SGLang passes its TP group's device group (NCCL on GPU)
    num_local = num_experts // world
    g = torch.Generator().manual_seed(_EXPERT_SEED)
    scales = (1.0 + 0.25 * torch.randn(num_experts, hidden, generator=g)).to(device)
    res = {"plugin": how, "resolved_backend": resolved, "flag": os.environ.get("UCCL_EP_SGLANG"),
           "Buffer_is_uccl_ep": dm.Buffer is uccl_ep.Buffer, "Config_is_uccl_ep": dm.Config is uccl_ep.Config}
    step, ok = 0, res["Buffer_is_uccl_ep"] and res["Config_is_uccl_ep"]
    from sglang.srt.batch_overlap.two_batch_overlap import MaybeTboDeepEPDispatcher

    for mode, batches, config, tbo in SCENARIOS:
        get_resources().buffers.pop("deepep_ep_state", None)  # one process-wide buffer per scenario
        dm.DeepEPConfig._instance = None
        get_flags().moe.deepep_config = config
        get_flags().moe.tbo_enabled = tbo  # what --enable-two-batch-overlap resolves to
        kwargs = dict(group=group, router_topk=topk, permute_fusion=True, num_experts=num_experts,
                      num_local_experts=num_local, hidden_size=hidden, params_dtype=torch.bfloat16,
                      deepep_mode=DeepEPMode(mode), async_finish=True, return_recv_hook=True)
        dispatcher = MaybeTboDeepEPDispatcher(**kwargs) if tbo else dm.DeepEPDispatcher(**kwargs)
        if tbo:
            ok &= len(dispatcher._inners) == 2
        name = f"{mode}{'+config' if config else ''}{'+tbo' if tbo else ''}"
        for is_extend in batches:
            step += 1
            x, w, ids = _tensors(rank, step, tokens, hidden, num_experts, topk, device)
            if tbo:
                got = _run_tbo_batch(dispatcher, mode, is_extend, rank, x, w, ids, scales, num_local)
            else:
                got = _run_batch(dispatcher, is_extend, rank, world, x, w, ids, scales, num_local)
            ref = _reference(x, w, ids, scales)
            diff = calc_diff(got.float(), ref)
            max_abs = float((got.float() - ref).abs().max())
            good = diff < 1e-4 and max_abs <= 0.05 * float(ref.abs().max()) + 1e-3
            res[f"{name}/{'extend' if is_extend else 'decode'}#{step}"] = {"ok": good, "calc_diff": diff,
                                                                            "max_abs": max_abs}
            ok &= good
        buffer = get_resources().buffers["deepep_ep_state"].buffer
        res[f"{name}/buffer"] = f"{type(buffer).__module__}.{type(buffer).__name__} low_latency_mode={buffer.low_latency_mode}"
        res.setdefault("executors", []).append(buffer.backend)
        ok &= isinstance(buffer, uccl_ep.Buffer)
        if config:
            cfg = dm.DeepEPConfig.get_instance()
            good = isinstance(cfg.normal_dispatch_config, uccl_ep.Config) and cfg.num_sms == 24
            res[f"{name}/deepep_config_is_uccl_ep"] = good
            ok &= good
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    res["ok"] = bool(ok)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--backend", choices=("auto", "host", "reference", "cuda"), default=None,
                    help="uccl_ep executor (UCCL_EP_BACKEND); default: host on CPU, auto on CUDA")
    args = ap.parse_args(argv)
    from uccl_ep.spawn import run_ranks

    # NOTES: UCCL_EP_SGLANG is not preset: each rank resolves `--moe-a2a-backend uccl`, whose hook
    # sets it and swaps the dispatcher, exactly as the launcher + scheduler pair does.
    env = {"SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": str(max(args.tokens, 1))}
    # NOTES: on CPU the host executor runs the real protocol (queue -> proxy -> transport) under
    # SGLang's calls; `--backend reference` is the oracle run. The executor that served every buffer
    # is reported and checked, so a fallback cannot pass unnoticed.
    backend = args.backend or ("host" if args.device == "cpu" else "auto")
    env["UCCL_EP_BACKEND"] = backend
    model_dir = tempfile.mkdtemp(prefix="tiny-moe-")
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_qwen3_moe_config.json"),
                os.path.join(model_dir, "config.json"))
    t0 = time.time()
    try:
        results = run_ranks(rank_main, args.world, args.device, args.tokens, args.hidden, args.experts, args.topk,
                            model_dir, timeout_s=args.timeout, backend="nccl" if args.device == "cuda" else "gloo",
                            env=env)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    for rank, res in enumerate(results):
        print(json.dumps({"rank": rank, **res}))
    executors = sorted({e for r in results for e in r.get("executors", [])})
    ok = all(r["ok"] for r in results) and (backend == "auto" or executors == [backend])
    print(json.dumps({"sglang_deepep_dispatcher": "PASS" if ok else "FAIL", "device": args.device,
                      "executors": executors,
                      "scenarios": [f"{m}{'+config' if c else ''}{'+tbo' if t else ''}" for m, _, c, t in SCENARIOS],
                      "seconds": round(time.time() - t0, 1)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
