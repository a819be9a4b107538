"""Drive vLLM's modular MoE kernel (`FusedMoEKernel`: DeepEP prepare/finalize + experts) on uccl_ep.

Per rank (2 by default, one process each), for every case below:
  1. `deep_ep` means uccl_ep (UCCL_EP_VLLM=1, as after `--all2all-backend uccl_*`); vLLM's own
     DeepEP all2all manager builds the `uccl_ep.Buffer` and vLLM's own
     `maybe_make_prepare_finalize` builds the prepare/finalize from the quantization config
     (it decides FP8 dispatch itself);
  2. `FusedMoEKernel(prepare_finalize, experts)` runs the whole MoE layer (`apply`) on random BF16
     tokens with top-k routing and SiLU-gated experts;
  3. the output is compared with an independent torch MoE (fp32, same weights; for FP8 dispatch
     the activations are cast to e4m3 the way the dispatch does, with its own code here).

Cases (--cases, default all):
  ll-bf16   DeepEPLLPrepareAndFinalize + vLLM's NaiveBatchedExperts, BF16 dispatch
  ll-fp8    block-FP8 weights (fp8_w8a8, 128x128): vLLM turns on FP8 dispatch (e4m3 + fp32 scales)
  ll-ue8m0  the same with experts that take packed UE8M0 scales (as DeepGEMM on SM100 does):
            vLLM's post_init_setup switches the dispatch to round_scale + use_ue8m0
  ht-bf16   DeepEPHTPrepareAndFinalize + standard-format experts (torch, below)
  ht-fp8    block-FP8: vLLM quantizes before the dispatch, uccl_ep dispatches (e4m3, scales)
--dbo on runs each case as two micro-batches through vLLM's DBO machinery (`make_ubatch_contexts`,
`UBatchWrapper._run_ubatches`, the dbo_* hooks inside the kernel and prepare/finalize), as
`--enable-dbo` does; on CPU with the stream stand-ins of cpu_shims.py.

    python drive_modular_kernel.py --device cuda --dbo both   # GPU machine, 2 GPUs
    python drive_modular_kernel.py --device cpu --dbo both    # CPU (CI): gloo, host executor

Prints one JSON line per rank and a summary line; exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from drive_deepep_prepare_finalize import _inputs, _load_plugin, _manager  # noqa: E402

CASES = ("ll-bf16", "ll-fp8", "ll-ue8m0", "ht-bf16", "ht-fp8")
_WEIGHT_SEED = 4321
_BLOCK = 128


def _weights(num_experts: int, hidden: int, inter: int, fp8: bool, device):
    """(w1 [E, 2I, H], w2 [E, H, I], w1_scale, w2_scale, w1_ref, w2_ref): the kernel's weights
    (bf16, or e4m3 with 128x128 block scales) and the fp32 values they stand for."""
    import torch
    g = torch.Generator().manual_seed(_WEIGHT_SEED)
    w1 = torch.randn(num_experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) / inter ** 0.5
    if not fp8:
        w1, w2 = w1.to(torch.bfloat16), w2.to(torch.bfloat16)
        return w1.to(device), w2.to(device), None, None, w1.float().to(device), w2.float().to(device)
    out = []
    for w in (w1, w2):
        e, n, k = w.shape
        blocks = w.view(e, n // _BLOCK, _BLOCK, k // _BLOCK, _BLOCK)
        scale = blocks.abs().amax(dim=(2, 4)) / 448.0
        q = (blocks / scale[:, :, None, :, None]).to(torch.float8_e4m3fn)
        ref = (q.float() * scale[:, :, None, :, None]).view(e, n, k)
        out.append((q.view(e, n, k).to(device), scale.to(device), ref.to(device)))
    (q1, s1, r1), (q2, s2, r2) = out
    return q1, q2, s1, s2, r1, r2


def _cast_fp8_like_dispatch(x, pow2: bool):
    """What an FP8 dispatch delivers for BF16 ``x`` [T, H]: e4m3 per 128-channel block with scale
    amax/448 (rounded up to a power of two for UE8M0), dequantized to fp32."""
    import torch
    t, h = x.shape
    blocks = x.float().view(t, h // _BLOCK, _BLOCK)
    scale = blocks.abs().amax(dim=-1, keepdim=True).clamp_min(1e-4) / 448.0
    if pow2:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return (q.float() * scale).view(t, h)


def _reference(x, w, ids, w1, w2, fp8_cast, pow2):
    import torch
    import torch.nn.functional as F
    xin = _cast_fp8_like_dispatch(x, pow2) if fp8_cast else x.float()
    inter = w1.shape[1] // 2
    out = torch.zeros_like(xin)
    for k in range(ids.shape[1]):
        for e in ids[:, k].unique().tolist():
            rows = ids[:, k] == e
            h = xin[rows] @ w1[e].T
            y = (F.silu(h[:, :inter]) * h[:, inter:]) @ w2[e].T
            out[rows] += w[rows, k:k + 1] * y
    return out


def _experts_classes():
    """vLLM's NaiveBatchedExperts, a UE8M0-consuming variant, and standard-format torch experts."""
    import torch
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.experts.fused_batched_moe import NaiveBatchedExperts
    from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP

    class UE8M0BatchedExperts(NaiveBatchedExperts):
        """NaiveBatchedExperts that, like DeepGEMM's batched experts on SM100, take the dispatch's
        activation scales packed as UE8M0 (int32 [E, T, H/512], four exponent bytes, lowest block
        in the lowest byte) and expand them before the (unchanged) batched GEMMs."""

        def supports_packed_ue8m0_act_scales(self) -> bool:
            return True

        def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                  expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                  apply_router_weight_on_input):
            assert a1q_scale is not None and a1q_scale.dtype == torch.int32, a1q_scale
            e, t, n = a1q_scale.shape
            exps = a1q_scale.contiguous().view(torch.uint8).view(e, t, n * 4).to(torch.int32)
            scales = (exps << 23).view(torch.float32)
            self.ue8m0_scales_seen = True
            return super().apply(output, hidden_states, w1, w2, topk_weights, topk_ids, activation,
                                 global_num_experts, expert_map, scales, a2_scale, workspace13, workspace2,
                                 expert_tokens_meta, apply_router_weight_on_input)

    class TorchStandardExperts(mk.FusedMoEExpertsModular):
        """Standard-format experts (tokens [M, H] with their top-k global ids, as DeepEP HT hands
        them over), computed with torch: the work TritonExperts / DeepGemmExperts do on a GPU.
        Applies the top-k weights and reduces, so finalize gets [M, H] (TopKWeightAndReduceNoOP)."""

        @staticmethod
        def activation_format():
            return mk.FusedMoEActivationFormat.Standard

        @staticmethod
        def _supports_current_device() -> bool:
            return True

        @staticmethod
        def _supports_no_act_and_mul() -> bool:
            return False

        @staticmethod
        def _supports_quant_scheme(weight_key, activation_key) -> bool:
            return True

        @staticmethod
        def _supports_activation(activation) -> bool:
            return True

        @staticmethod
        def _supports_parallel_config(moe_parallel_config) -> bool:
            return True

        def finalize_weight_and_reduce_impl(self):
            return TopKWeightAndReduceNoOP()

        def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta,
                             activation):
            return (M, max(N, K)), (M, N // 2), (M, K)

        def _dequant(self, t, scale):
            from vllm.model_executor.layers.quantization.utils.quant_utils import group_broadcast
            return t.float() if scale is None else t.float() * group_broadcast(scale.float(), t.shape)

        def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                  expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                  apply_router_weight_on_input):
            x = self._dequant(hidden_states, a1q_scale)
            local = topk_ids if expert_map is None else expert_map[topk_ids]
            inter = w1.size(1) // 2
            acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
            for e in range(w1.size(0)):
                rows, ks = torch.nonzero(local == e, as_tuple=True)
                if rows.numel() == 0:
                    continue
                w1e = self._dequant(w1[e], None if self.w1_scale is None else self.w1_scale[e])
                w2e = self._dequant(w2[e], None if self.w2_scale is None else self.w2_scale[e])
                h = (x[rows] @ w1e.T).to(output.dtype)
                act = torch.empty(rows.numel(), inter, dtype=output.dtype, device=x.device)
                self.activation(activation, act, h)  # vLLM's apply_moe_activation
                y = act.float() @ w2e.T
                acc.index_add_(0, rows, topk_weights[rows, ks].float().unsqueeze(1) * y)
            output.copy_(acc.to(output.dtype))

    return NaiveBatchedExperts, UE8M0BatchedExperts, TorchStandardExperts


class _BufferSpy:
    """Records every dispatch and combine the kernel asks of the Buffer (which is unchanged): the
    micro-batch it ran for (vLLM's DBO id; 0 without DBO), and what the dispatch was asked to send
    (FP8 flags of low_latency_dispatch, dtypes of normal-mode dispatch's ``x``)."""

    def __init__(self, buffer, low_latency: bool):
        from vllm.v1.worker.ubatching import dbo_current_ubatch_id

        self.ops, self.sent, self.buffer = [], [], buffer
        self.names = ("low_latency_dispatch", "low_latency_combine") if low_latency else ("dispatch", "combine")
        for name in self.names:
            original = getattr(buffer, name)

            def spy(*args, _name=name, _original=original, **kwargs):
                self.ops.append([_name.rsplit("_", 1)[-1], dbo_current_ubatch_id()])
                if _name == "low_latency_dispatch":
                    self.sent.append({k: kwargs.get(k) for k in ("use_fp8", "round_scale", "use_ue8m0")})
                elif _name == "dispatch":
                    x = kwargs["x"] if "x" in kwargs else args[0]
                    self.sent.append([str(t.dtype) for t in (x if isinstance(x, tuple) else (x,))])
                return _original(*args, **kwargs)

            setattr(buffer, name, spy)

    def remove(self) -> None:
        for name in self.names:
            delattr(self.buffer, name)  # the class's methods again


def _run_case(case, rank, world, device, managers, buffers, x, w, ids, args, dbo):
    import torch
    import uccl_ep
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation as Act
    from vllm.model_executor.layers.fused_moe.all2all_utils import maybe_make_prepare_finalize
    from vllm.model_executor.layers.fused_moe.config import (FUSED_MOE_UNQUANTIZED_CONFIG, FusedMoEConfig,
                                                             FusedMoEParallelConfig, RoutingMethodType,
                                                             fp8_w8a8_moe_quant_config)
    from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEKernel

    mode, dtype = case.split("-")
    fp8 = dtype in ("fp8", "ue8m0")
    E, H, inter, T = args.experts, args.hidden, args.inter, args.tokens
    L = E // world
    w1, w2, s1, s2, r1, r2 = _weights(E, H, inter, fp8, device)
    sl = slice(rank * L, (rank + 1) * L)
    w1, w2 = w1[sl].contiguous(), w2[sl].contiguous()
    qc = (fp8_w8a8_moe_quant_config(s1[sl].contiguous(), s2[sl].contiguous(), block_shape=[_BLOCK, _BLOCK])
          if fp8 else FUSED_MOE_UNQUANTIZED_CONFIG)
    backend = "deepep_low_latency" if mode == "ll" else "deepep_high_throughput"
    pcfg = FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=world, ep_size=world, tp_rank=0, pcp_rank=0,
                                  dp_rank=rank, ep_rank=rank, sp_size=1, use_ep=True, all2all_backend=backend,
                                  enable_eplb=False)
    moe = FusedMoEConfig(num_experts=E, experts_per_token=args.topk, hidden_dim=H, intermediate_size=inter,
                         num_local_experts=L, num_logical_experts=E, activation=Act.SILU, device=device,
                         routing_method=RoutingMethodType.Renormalize, moe_parallel_config=pcfg,
                         in_dtype=torch.bfloat16, max_num_tokens=T)
    manager = managers[mode]
    pf = maybe_make_prepare_finalize(moe, qc, all2all_manager=manager)
    naive, ue8m0, standard = _experts_classes()
    if mode == "ll":
        cls = ue8m0 if dtype == "ue8m0" else naive
        experts = cls(moe, qc, max_num_tokens=T, num_dispatchers=pf.num_dispatchers())
    else:
        experts = standard(moe, qc)
    kernel = FusedMoEKernel(pf, experts)  # post_init_setup: UE8M0 dispatch when the experts take it
    spy = _BufferSpy(pf.buffer, low_latency=mode == "ll")
    expert_map = None
    if mode == "ht":
        expert_map = torch.full((E,), -1, dtype=torch.int32, device=device)
        expert_map[sl] = torch.arange(L, dtype=torch.int32, device=device)

    def moe_apply(tokens):
        return kernel.apply(x[tokens], w1, w2, w[tokens], ids[tokens], activation=Act.SILU, global_num_experts=E,
                            expert_map=expert_map, apply_router_weight_on_input=False)

    out = _run_dbo(moe_apply, T, device) if dbo else moe_apply(torch.arange(T, device=device))
    ref = _reference(x, w, ids, r1, r2, fp8, dtype == "ue8m0")
    res = _compare(out, ref)
    if mode == "ll":
        want = {"use_fp8": fp8, "round_scale": dtype == "ue8m0", "use_ue8m0": dtype == "ue8m0"}
        if dtype == "ue8m0":
            res["ok"] &= bool(getattr(experts, "ue8m0_scales_seen", False))
    else:
        want = ["torch.float8_e4m3fn", "torch.float32"] if fp8 else ["torch.bfloat16"]
    res["dispatched"] = spy.sent[-1] if spy.sent else None
    res["ok"] &= len(spy.sent) == (2 if dbo else 1) and all(c == want for c in spy.sent)
    # With DBO the second micro-batch's dispatch runs while the first one's experts wait for their
    # combine: the overlap `--enable-dbo` is for.
    res["ops"] = spy.ops
    res["ok"] &= spy.ops == ([["dispatch", 0], ["dispatch", 1], ["combine", 0], ["combine", 1]] if dbo
                             else [["dispatch", 0], ["combine", 0]])
    spy.remove()
    res["kernel"] = f"FusedMoEKernel({type(pf).__name__}, {type(experts).__name__})"
    res["executor"] = pf.buffer.backend
    res["ok"] &= isinstance(pf.buffer, uccl_ep.Buffer)
    buffers.add(pf.buffer)
    return res


def _compare(out, ref) -> dict:
    import torch
    from uccl_ep.utils import calc_diff
    diff = calc_diff(out.float(), ref)
    # NOTES: the bound leaves room for BF16 rounding inside the experts but not for the e4m3 error
    # of an FP8 dispatch compared with the wrong (unquantized, or differently scaled) reference.
    max_abs = float((out.float() - ref).abs().max())
    ok = bool(torch.isfinite(out.float()).all()) and diff < 2e-5 and max_abs <= 0.05 * float(ref.abs().max()) + 1e-3
    return {"ok": ok, "calc_diff": diff, "max_abs": max_abs}


def _run_dbo(moe_apply, tokens: int, device):
    """Two micro-batches through vLLM's DBO runner: one thread each, switching at the dbo_* points."""
    import threading
    import torch
    from vllm.v1.worker.gpu_ubatch_wrapper import UbatchMetadata, UBatchWrapper
    from vllm.v1.worker.ubatching import make_ubatch_contexts

    if device.type == "cpu":
        import cpu_shims
        compute, comm = cpu_shims.install_streams()
    else:
        compute, comm = torch.cuda.current_stream(), torch.cuda.Stream()
    # NOTES: UBatchWrapper.__init__ wants a VllmConfig for CUDA-graph settings this run has no use
    # for; _run_ubatches reads only these two fields.
    runner = UBatchWrapper.__new__(UBatchWrapper)
    runner.runnable = None
    runner.device = -1 if device.type == "cpu" else device.index
    runner.ready_barrier = threading.Barrier(3)
    half = tokens // 2
    slices = [slice(0, half), slice(half, tokens)]
    ctxs = make_ubatch_contexts(num_micro_batches=2, compute_stream=compute, comm_stream=comm,
                                forward_contexts=[None, None], ready_barrier=runner.ready_barrier,
                                token_offsets=[s.start for s in slices])
    meta = [UbatchMetadata(context=c, input_ids=torch.arange(s.start, s.stop, device=device), positions=None,
                           inputs_embeds=None, intermediate_tensors=None, num_tokens=s.stop - s.start)
            for c, s in zip(ctxs, slices)]

    def model(input_ids, positions, intermediate_tensors, inputs_embeds):
        return moe_apply(input_ids)

    return runner._run_ubatches(meta, model)


def rank_main(rank: int, world: int, device_kind: str, cases: list, args_d: dict, dbo_modes: list) -> dict:
    import torch
    import torch.distributed as dist

    args = argparse.Namespace(**args_d)
    # NOTES: all2all_utils binds the DeepEP prepare/finalize names at import only on CUDA-like
    # platforms; imported before the plugin, the alias gives them to it on every platform.
    import vllm.model_executor.layers.fused_moe.all2all_utils  # noqa: F401
    how = _load_plugin()
    from vllm.distributed.device_communicators.all2all import DeepEPHTAll2AllManager, DeepEPLLAll2AllManager
    from vllm.v1.worker.workspace import init_workspace_manager

    device = torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda" else torch.device("cpu")
    if device.type == "cpu":
        import cpu_shims
        import vllm.model_executor.layers.fused_moe.modular_kernel as mk
        cpu_shims.install_kernels()
        mk.PIN_MEMORY = False  # see drive_deepep_prepare_finalize.py
    init_workspace_manager(device, num_ubatches=2 if True in dbo_modes else 1)
    cpu_group = dist.new_group(list(range(world)), backend="gloo")
    managers = {}
    for mode, cls in (("ht", DeepEPHTAll2AllManager), ("ll", DeepEPLLAll2AllManager)):
        if any(c.startswith(mode) for c in cases):
            m = _manager(cls, cpu_group)
            m.dp_world_size = world
            managers[mode] = m
    x, w, ids = _inputs(rank, args.tokens, args.hidden, args.experts, args.topk, device)
    results = {"plugin": how}
    buffers: set = set()
    for dbo in dbo_modes:
        for case in cases:
            t0 = time.time()
            key = case + ("+dbo" if dbo else "")
            results[key] = _run_case(case, rank, world, device, managers, buffers, x, w, ids, args, dbo)
            results[key]["seconds"] = round(time.time() - t0, 2)
    for buffer in buffers:
        buffer.destroy()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier(group=cpu_group)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {', '.join(CASES)}")
    ap.add_argument("--dbo", choices=("off", "on", "both"), default="off",
                    help="on: two micro-batches through vLLM's DBO runner; both: each case without, then with")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048, help="LL needs one of vLLM's 2048..8192")
    ap.add_argument("--inter", type=int, default=128, help="expert intermediate size (multiple of 128)")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--backend", choices=("auto", "host", "reference", "cuda"), default=None,
                    help="uccl_ep executor (UCCL_EP_BACKEND); default: host on CPU, auto on CUDA")
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"unknown case(s) {unknown}; expected a subset of {', '.join(CASES)}")
    from uccl_ep.spawn import run_ranks

    backend = args.backend or ("host" if args.device == "cpu" else "auto")
    env = {"UCCL_EP_VLLM": "1", "UCCL_EP_BACKEND": backend}
    if args.device == "cpu":
        env["VLLM_DEEPEP_BUFFER_SIZE_MB"] = "64"
    t0 = time.time()
    arg_d = {k: getattr(args, k) for k in ("tokens", "hidden", "inter", "experts", "topk")}
    dbo_modes = {"off": [False], "on": [True], "both": [False, True]}[args.dbo]
    keys = [c + ("+dbo" if dbo else "") for dbo in dbo_modes for c in cases]
    results = run_ranks(rank_main, args.world, args.device, cases, arg_d, dbo_modes, timeout_s=args.timeout,
                        backend="nccl" if args.device == "cuda" else "gloo", env=env)
    ok = True
    for rank, res in enumerate(results):
        for key in keys:
            ok &= bool(res[key]["ok"]) and (backend == "auto" or res[key]["executor"] == backend)
        print(json.dumps({"rank": rank, **res}))
    print(json.dumps({"vllm_modular_kernel": "PASS" if ok else "FAIL", "cases": keys,
                      "executors": sorted({r[k]["executor"] for r in results for k in keys}),
                      "device": args.device, "seconds": round(time.time() - t0, 1)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
