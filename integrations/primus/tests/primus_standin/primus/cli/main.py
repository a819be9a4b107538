"""Stand-in of Primus's CLI entry (``primus/cli/main.py train pretrain --config EXP [overrides]``),
reduced to what decides and drives the MoE token dispatch on the turbo DeepEP route (tests only;
AMD-AGI/Primus is not on PyPI and cannot be installed in CI).

What it keeps from Primus:

- the command shape, and that the experiment file must exist;
- the override rules of ``primus/core/launcher/parser.py``: ``--key value``, ``--key=value``,
  ``--flag`` (True), values evaluated as Python literals, and every key must already exist in the
  pre-trainer config (an unknown key is an error);
- the defaults of ``primus/configs/modules/megatron/primus_turbo.yaml`` that matter here
  (``enable_primus_turbo`` and ``use_turbo_deepep`` false, ``turbo_deepep_num_cu`` 32,
  ``turbo_sync_free_moe_stage`` 0);
- the condition of the ``megatron.turbo.moe_dispatcher`` patch (primus_turbo importable,
  tensor parallel 1, ``enable_primus_turbo`` and ``use_turbo_deepep``; sync-free stage >= 2
  implies ``use_turbo_deepep``), and what its token dispatcher then calls in Primus-Turbo:
  ``set_buffer_global_config(num_use_cu=turbo_deepep_num_cu)``, ``moe_dispatch_impl`` (with
  ``num_worst_tokens`` at sync-free stage >= 2), the cached dispatch of the backward pass and
  ``moe_combine_impl``.

It runs a few such steps on the torchrun ranks (gloo on CPU), checks every rank's received rows
and combined output against a plain torch computation of the same routing, and prints one JSON
line per rank: which backend Primus-Turbo resolved and which class served it.
"""

from __future__ import annotations

import ast
import json
import os
import sys

_DEFAULTS = {
    # primus_turbo.yaml
    "enable_primus_turbo": False, "use_turbo_deepep": False, "turbo_deepep_num_cu": 32,
    "turbo_sync_free_moe_stage": 0, "turbo_deepep_use_comm_stream": False,
    # megatron model / parallelism keys the recipes override
    "tensor_model_parallel_size": 1, "expert_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
    "train_iters": 10, "mock_data": False, "num_experts": 8, "moe_router_topk": 2, "hidden_size": 64,
    "micro_batch_size": 1, "seq_length": 16, "moe_permute_fusion": False, "moe_router_dtype": "fp32",
    "moe_shared_expert_overlap": False,
}


def parse_overrides(args: list[str]) -> dict:
    out, i = {}, 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            i += 1
            continue
        key = arg[2:]
        if "=" in key:
            key, val = key.split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            val = args[i + 1]
            i += 1
        else:
            val = True
        if isinstance(val, str):
            try:
                val = ast.literal_eval(val)
            except (ValueError, SyntaxError):
                pass
        out[key] = val
        i += 1
    return out


def load_config(argv: list[str]) -> dict:
    if argv[:2] != ["train", "pretrain"] or "--config" not in argv:
        raise SystemExit("usage: main.py train pretrain --config EXP.yaml [--key value ...]")
    at = argv.index("--config")
    exp = argv[at + 1]
    if not os.path.isfile(exp):
        raise SystemExit(f"experiment config not found: {exp}")
    cfg = dict(_DEFAULTS)
    overrides = parse_overrides(argv[2:at] + argv[at + 2:])
    for key, val in overrides.items():
        if key not in cfg:
            raise AssertionError(f"Override key '{key}' does not exist in pre_trainer config.")
        cfg[key] = val
    return cfg


def turbo_deepep_enabled(cfg: dict) -> bool:
    import importlib.util

    if importlib.util.find_spec("primus_turbo") is None:
        return False
    use = bool(cfg["use_turbo_deepep"]) or int(cfg["turbo_sync_free_moe_stage"]) >= 2
    return cfg["tensor_model_parallel_size"] == 1 and bool(cfg["enable_primus_turbo"]) and use


def run_steps(cfg: dict, steps: int = 2) -> dict:
    import torch
    import torch.distributed as dist

    from primus_turbo.pytorch.kernels.moe import moe_dispatch_combine_impl as impl

    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    E, K, H, T = cfg["num_experts"], cfg["moe_router_topk"], cfg["hidden_size"], 12
    nle = E // world
    impl.set_buffer_global_config(num_use_cu=int(cfg["turbo_deepep_num_cu"]))
    worst = T * world if int(cfg["turbo_sync_free_moe_stage"]) >= 2 else 0
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randint(-8, 9, (T, H), generator=g).to(torch.bfloat16)
        idx = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K].long().contiguous()
        w = torch.rand(T, K, generator=g)
        recv_x, recv_idx, recv_w, counts, handle = impl.moe_dispatch_impl(
            x, group, topk_idx=idx, token_weights=w, num_experts=E, async_finish=True,
            allocate_on_comm_stream=True, num_worst_tokens=worst)
        xs, idxs = [None] * world, [None] * world
        dist.all_gather_object(xs, x)
        dist.all_gather_object(idxs, idx)
        rows = [(s, t) for s in range(world) for t in range(T)
                if any(rank * nle <= int(e) < (rank + 1) * nle for e in idxs[s][t])]
        assert len(rows) <= recv_x.shape[0], (len(rows), recv_x.shape)
        for i, (s, t) in enumerate(rows):
            assert torch.equal(recv_x[i], xs[s][t]), f"step {step}: row {i} is not token {t} of rank {s}"
        again, *_ = impl.moe_dispatch_impl(2 * x, group, handle=handle)  # backward: cached dispatch
        assert torch.equal(again[:len(rows)], 2 * recv_x[:len(rows)])
        combined, _ = impl.moe_combine_impl(recv_x, group, handle, topk_weights=recv_w)
        reached = torch.zeros(T)
        for r in range(world):
            reached += torch.tensor([any(r * nle <= int(e) < (r + 1) * nle for e in idx[t]) for t in range(T)]).float()
        assert torch.equal(combined, (x.float() * reached.unsqueeze(1)).to(x.dtype)), f"step {step}: combine"
    name = impl._get_backend_name()
    backend = impl._backend_instances[name]
    buf = getattr(backend, "_buffer", None)
    return {"rank": rank, "backend_name": name, "backend_class": type(backend).__name__,
            "buffer": f"{type(buf).__module__}.{type(buf).__name__}", "executor": getattr(buf, "backend", None),
            "num_sms": type(buf).num_sms if buf is not None else None, "steps": steps}


def _emit(record: dict) -> None:
    """One JSON line, written in one call: the ranks share stdout, and print() writes the text and its
    newline separately, so two ranks' lines could run together."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main(argv=None) -> int:
    cfg = load_config(list(sys.argv[1:] if argv is None else argv))
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        if not turbo_deepep_enabled(cfg):
            _emit({"rank": dist.get_rank(), "backend_name": None,
                   "why": "megatron.turbo.moe_dispatcher patch not applied (its condition is false)"})
            return 0
        _emit(run_steps(cfg))
        dist.barrier()
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
