"""Drive vLLM's own DeepEP HT and LL prepare/finalize classes on uccl_ep, against a torch MoE.

Per rank (2 by default, one process each):
  1. vLLM's general plugins are loaded with UCCL_EP_VLLM=1 (as in an engine-core/worker process
     after `--all2all-backend uccl_*`), so `deep_ep` means uccl_ep;
  2. the Buffer comes from vLLM's own `DeepEPHTAll2AllManager.get_handle` /
     `DeepEPLLAll2AllManager.get_handle` on a gloo CPU group (what vLLM passes), and must be a
     `uccl_ep.Buffer`;
  3. `DeepEPHTPrepareAndFinalize` / `DeepEPLLPrepareAndFinalize` prepare (dispatch) random BF16
     tokens with top-k routing; each rank applies its local experts (y_e(x) = tanh(x) * a_e);
     finalize (combine) returns the MoE output, compared with a torch reference of the whole MoE.

    python drive_deepep_prepare_finalize.py --device cuda            # GPU machine, 2 GPUs
    python drive_deepep_prepare_finalize.py --device cpu --mode ht   # CPU (CI): gloo, host executor
    python drive_deepep_prepare_finalize.py --device cpu --backend reference   # the semantic oracle

FP8/UE8M0 dispatch and DBO micro-batching run through vLLM's modular kernel in
drive_modular_kernel.py. Not exercised here: CUDA graphs, the manager's __init__ (it reads vLLM's parallel state; the
managers are built without it, then their get_handle runs as in vLLM). Prints one JSON line per
mode and exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_EXPERT_SEED = 1234


def _expert_scales(num_experts: int, hidden: int, device):
    import torch
    g = torch.Generator().manual_seed(_EXPERT_SEED)
    return (1.0 + 0.25 * torch.randn(num_experts, hidden, generator=g)).to(device)


def _inputs(rank: int, tokens: int, hidden: int, num_experts: int, topk: int, device):
    import torch
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    scores = torch.randn(tokens, num_experts, generator=g)
    w, ids = torch.topk(scores.softmax(dim=-1), topk, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    return x.to(device), w.float().to(device), ids.to(torch.int64).to(device)


def _reference(x, w, ids, scales):
    import torch
    y = torch.tanh(x.float())
    out = torch.zeros_like(y)
    for k in range(ids.shape[1]):
        out += w[:, k:k + 1] * y * scales[ids[:, k]]
    return out


def _load_plugin() -> str:
    """vLLM's plugin loader when the entry point is installed, else the plugin's register()."""
    from importlib import metadata
    if any(ep.value.startswith("uccl_ep_vllm.") for ep in metadata.entry_points(group="vllm.general_plugins")):
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        return "entry point (vllm.plugins.load_general_plugins)"
    from uccl_ep_vllm.plugin import register
    register()
    return "uccl_ep_vllm.plugin.register() (entry point not installed here)"


def _manager(cls, cpu_group):
    # NOTES: All2AllManagerBase.__init__ reads vLLM's DP/TP groups, which need vLLM's full parallel
    # state; the fields get_handle/_make_all2all_kwargs use are set as __init__ would set them.
    from vllm.distributed.device_communicators.base_device_communicator import Cache
    m = cls.__new__(cls)
    m.cpu_group, m.tcp_store_group = cpu_group, None
    m.rank, m.world_size = cpu_group.rank(), cpu_group.size()
    m.internode, m.support_fault_tolerance = False, False
    m.handle_cache, m.num_sms = Cache(), 20
    return m


def _check(name, got, ref, results):
    import torch
    from uccl_ep.utils import calc_diff
    diff = calc_diff(got.float(), ref)
    max_abs = float((got.float() - ref).abs().max()) if got.numel() else 0.0
    ok = bool(torch.isfinite(got.float()).all()) and diff < 1e-4 and max_abs <= 0.05 * float(ref.abs().max()) + 1e-3
    results[name] = {"ok": ok, "calc_diff": diff, "max_abs": max_abs}


_DROP_IN = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deep_ep"))


def rank_main(rank: int, world: int, device_kind: str, modes: list, tokens: int, hidden: int,
              num_experts: int, topk: int, route: str = "plugin") -> dict:
    import torch
    import torch.distributed as dist
    import uccl_ep

    if route == "drop-in":
        # NOTES: vLLM's own deepep_* backends with `deep_ep` = uccl-ep's drop-in (integrations/deep_ep),
        # no uccl_* value and no alias: what a user without the plugin runs.
        sys.path.insert(0, _DROP_IN)
        import deep_ep
        assert deep_ep.__file__.startswith(_DROP_IN), deep_ep.__file__
        how = "deep_ep drop-in (--all2all-backend deepep_*)"
        _load_plugin()
    else:
        how = _load_plugin()
    device = torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda" else torch.device("cpu")
    cpu_group = dist.new_group(list(range(world)), backend="gloo")
    import deep_ep
    from vllm.distributed.device_communicators.all2all import DeepEPHTAll2AllManager, DeepEPLLAll2AllManager
    from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG as QC
    from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import (TopKWeightAndReduceDelegate,
                                                                             TopKWeightAndReduceNoOP)
    from vllm.utils.import_utils import has_deep_ep

    if device.type == "cpu":
        # NOTES: vLLM decides pinned host copies from the platform, which on a GPU-less machine with
        # the CUDA wheel still says yes; pinning then fails. Only the CPU run turns it off.
        import vllm.model_executor.layers.fused_moe.modular_kernel as mk
        mk.PIN_MEMORY = False
    num_local = num_experts // world
    scales = _expert_scales(num_experts, hidden, device)
    x, w, ids = _inputs(rank, tokens, hidden, num_experts, topk, device)
    ref = _reference(x, w, ids, scales)
    results = {"plugin": how, "has_deep_ep": has_deep_ep(), "deep_ep_is_uccl_ep": deep_ep.Buffer is uccl_ep.Buffer}

    if "ht" in modes:
        from vllm.model_executor.layers.fused_moe.prepare_finalize.deepep_ht import DeepEPHTPrepareAndFinalize
        buffer = _manager(DeepEPHTAll2AllManager, cpu_group).get_handle({})
        results["ht_buffer"] = type(buffer).__module__ + "." + type(buffer).__name__
        results.setdefault("executors", []).append(buffer.backend)
        pf = DeepEPHTPrepareAndFinalize(buffer, num_dispatchers=world, dp_size=world,
                                        rank_expert_offset=rank * num_local)
        rx, _, meta, rids, rw = pf.prepare(x, w, ids, num_experts, None, False, QC)
        local = (rids >= rank * num_local) & (rids < (rank + 1) * num_local)
        y = torch.tanh(rx.float())
        fused = torch.zeros_like(y)
        for k in range(rids.shape[1]):
            fused += torch.where(local[:, k:k + 1], rw[:, k:k + 1] * y * scales[rids[:, k].clamp(0, num_experts - 1)], 0.0)
        counts = torch.tensor([int((rids == rank * num_local + e).sum()) for e in range(num_local)])
        results["ht_counts_match"] = bool(torch.equal(meta.expert_num_tokens.cpu().to(counts.dtype), counts))
        out = torch.empty_like(x)
        pf.finalize(out, fused.to(torch.bfloat16), w, ids, False, TopKWeightAndReduceNoOP())
        _check("ht", out, ref, results)
        buffer.destroy()

    if "ll" in modes:
        from vllm.model_executor.layers.fused_moe.prepare_finalize.deepep_ll import DeepEPLLPrepareAndFinalize
        kwargs = dict(max_num_tokens_per_dp_rank=tokens, token_hidden_size=hidden, num_ep_ranks=world,
                      num_global_experts=num_experts, num_local_experts=num_local)
        manager = _manager(DeepEPLLAll2AllManager, cpu_group)
        buffer = manager.get_handle(kwargs)
        results["ll_buffer"] = type(buffer).__module__ + "." + type(buffer).__name__
        results.setdefault("executors", []).append(buffer.backend)
        pf = DeepEPLLPrepareAndFinalize(buffer, max_tokens_per_rank=tokens, num_dispatchers=world,
                                        use_fp8_dispatch=False)
        rx, _, meta, _, _ = pf.prepare(x, w, ids, num_experts, None, False, QC)
        counts = meta.expert_num_tokens.cpu()
        want = torch.bincount(ids.flatten().cpu(), minlength=num_experts)
        dist.all_reduce(want, group=cpu_group)  # every rank's tokens, per expert
        want = want[rank * num_local:(rank + 1) * num_local]
        results["ll_counts_match"] = bool(torch.equal(counts.to(torch.int64), want.to(torch.int64)))
        y = torch.zeros_like(rx)
        for e in range(num_local):
            n = int(counts[e])
            y[e, :n] = (torch.tanh(rx[e, :n].float()) * scales[rank * num_local + e]).to(torch.bfloat16)
        out = torch.empty_like(x)
        pf.finalize(out, y, w, ids, False, TopKWeightAndReduceDelegate())
        _check("ll", out, ref, results)
        buffer.destroy()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier(group=cpu_group)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--mode", choices=("ht", "ll", "both"), default="both")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=2048, help="LL needs one of vLLM's 2048..8192")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--route", choices=("plugin", "drop-in"), default="plugin",
                    help="plugin: uccl_* value + deep_ep alias (UCCL_EP_VLLM=1); drop-in: deepep_* with the deep_ep "
                         "drop-in package")
    ap.add_argument("--backend", choices=("auto", "host", "reference", "cuda"), default=None,
                    help="uccl_ep executor (UCCL_EP_BACKEND); default: host on CPU, auto on CUDA")
    args = ap.parse_args(argv)
    from uccl_ep.spawn import run_ranks

    modes = ["ht", "ll"] if args.mode == "both" else [args.mode]
    env = {"UCCL_EP_VLLM": "1"} if args.route == "plugin" else {}
    if args.device == "cpu":
        env["VLLM_DEEPEP_BUFFER_SIZE_MB"] = "64"  # CPU executors allocate it in host memory
    # NOTES: on CPU the host executor runs the real protocol under vLLM's calls; `--backend reference`
    # is the oracle run. The executor of every buffer is reported and checked.
    backend = args.backend or ("host" if args.device == "cpu" else "auto")
    env["UCCL_EP_BACKEND"] = backend
    t0 = time.time()
    results = run_ranks(rank_main, args.world, args.device, modes, args.tokens, args.hidden, args.experts,
                        args.topk, args.route, timeout_s=args.timeout, backend="nccl" if args.device == "cuda" else "gloo",
                        env=env)
    ok = True
    for rank, res in enumerate(results):
        for mode in modes:
            ok &= bool(res[mode]["ok"]) and res["deep_ep_is_uccl_ep"] and res[f"{mode}_buffer"] == "uccl_ep.buffer.Buffer"
        ok &= all(res.get(f"{mode}_counts_match", False) for mode in modes)
        print(json.dumps({"rank": rank, **res}))
    executors = sorted({e for r in results for e in r.get("executors", [])})
    ok &= backend == "auto" or executors == [backend]
    print(json.dumps({"vllm_deepep_prepare_finalize": "PASS" if ok else "FAIL", "modes": modes, "route": args.route,
                      "executors": executors,
                      "device": args.device, "seconds": round(time.time() - t0, 1)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
