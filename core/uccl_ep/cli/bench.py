"""`uccl-ep bench`: spawn local ranks (every GPU, else 2 CPU ranks), run normal (HT) and
low-latency (LL) dispatch + combine, verify every result, and print a table against an
all-to-all baseline measured in the same run.

`--matrix` runs a grid of shapes beside NCCL and DeepEP (uccl_ep.cli.bench_matrix).

Other benchmarks register as `uccl-ep bench <what>` (e.g. `fifo`, `transport`) through
`BENCH_TARGETS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run", "BENCH_TARGETS", "nic_model_from_args"]

# name -> (module, description); each module defines add_arguments(parser) and run(args) -> int.
BENCH_TARGETS: dict[str, tuple[str, str]] = {
    "ep": ("uccl_ep.cli.bench", "dispatch/combine, normal and low-latency (default)"),
    "fifo": ("uccl_ep.bench.fifo", "GPU/host -> proxy command queue throughput"),
    "transport": ("uccl_ep.bench.transport", "transport write-with-immediate rate and bandwidth"),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark dispatch/combine on local ranks (GPU if present, else CPU)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="ep", choices=sorted(BENCH_TARGETS),
                   help="what to benchmark: " + "; ".join(f"{k}: {v[1]}" for k, v in BENCH_TARGETS.items()))
    p.add_argument("--backend", default="auto", choices=["auto", "reference", "host", "cuda"])
    p.add_argument("--mode", default="both", choices=["ht", "ll", "both"], help="normal (ht), low-latency (ll) or both")
    p.add_argument("--ranks", type=int, default=0, help="local ranks (default: every GPU, or 2 on CPU)")
    p.add_argument("--cpu", action="store_true", help="run on CPU even if GPUs are present")
    p.add_argument("--num-tokens", type=int, default=0, help="tokens per rank (default: HT 4096 / LL 128 on GPU)")
    p.add_argument("--hidden", type=int, default=0, help="hidden size (default 7168 on GPU, 2048 on CPU)")
    p.add_argument("--num-topk", type=int, default=8)
    p.add_argument("--num-experts", type=int, default=0, help="experts (default: HT 256 / LL 288 on GPU)")
    p.add_argument("--num-sms", type=int, default=24, help="SMs for normal-mode kernels")
    p.add_argument("--force-proxy", action="store_true",
                   help="low-latency traffic through the CPU proxy even between GPUs of one host "
                        "(allow_nvlink_for_low_latency_mode=False; the cuda backend's forced-proxy path)")
    p.add_argument("--nodes", type=int, default=0,
                   help="treat the ranks as N nodes (ranks_per_node = ranks / N; e.g. 2 GPUs of one host as 2 "
                        "nodes): normal mode then runs the internode protocol and rows add DeepEP's RDMA-formula "
                        "GB/s and the bytes the proxy transport copied; low-latency mode runs hybrid (a node's "
                        "peers over NVLink, other nodes through the proxy; rows: cuda+hybrid, proxy writes/op)")
    p.add_argument("--rdma-chunk", type=int, default=0,
                   help="Config.num_max_rdma_chunked_send_tokens of normal-mode ops (default: the config table's): "
                        "the most tokens per Write through the proxy")
    p.add_argument("--rdma-recv", type=int, default=0,
                   help="Config.num_max_rdma_chunked_recv_tokens of normal-mode ops (ring depth in tokens)")
    p.add_argument("--nvl-mb", type=int, default=0,
                   help="MiB of each rank's NVL buffer for normal mode (default: the configs' "
                        "get_nvl_buffer_size_hint); through the proxy it is the region the rings share, so "
                        "it bounds their depth (Config's ring sizes are capped to what fits)")
    p.add_argument("--tune", action="append", default=[], metavar="KEY=VALUE",
                   help="a uccl_ep.Tuning field for every Buffer of the run, e.g. --tune ht_warps=24 "
                        "--tune ht_defines='UCCL_EP_HT_PUBLISH_EVERY=8' (repeatable; docs/api.md, Tuning)")
    p.add_argument("--nic-model", default="", metavar="SPEC",
                   help="put a NIC model around the proxy transport's traffic to other nodes (default: "
                        "UCCL_EP_NIC_MODEL): a "
                        "preset (efa-400g, efa-200g, cx7-400g), key=value pairs (bw=<bytes/s>, lat_us, reorder, "
                        "window_us, nics, seed) or a preset with overrides (efa-200g,nics=2); internode rows then add "
                        "the GB/s through the model and its share of the cap (bw x nics)")
    p.add_argument("--ht-dispatch", default="", metavar="KINDS",
                   help="normal-mode dispatch rows besides the cached one (DeepEP's tuned call), comma-separated: "
                        "fresh (new routing: layout tensors, the host waits for the counts), worst (new routing "
                        "with num_worst_tokens = tokens x ranks: no host wait)")
    p.add_argument("--iters", type=int, default=0, help="timed iterations (default 20 GPU / 5 CPU)")
    p.add_argument("--warmup", type=int, default=-1)
    p.add_argument("--no-check", action="store_true", help="skip result verification")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before the run is declared hung")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON ('-' for stdout)")
    p.add_argument("--dist", default="auto", choices=["auto", "spawn", "env"],
                   help="spawn local ranks, or join a job launched by torchrun/srun (env: RANK, WORLD_SIZE, "
                        "MASTER_ADDR, MASTER_PORT; LOCAL_RANK picks the GPU). auto = env when those are set")
    from . import bench_matrix
    bench_matrix.add_arguments(p)
    p.set_defaults(func=run)
    for name, (module_name, _) in BENCH_TARGETS.items():
        if name == "ep":
            continue
        try:
            module = __import__(module_name, fromlist=["add_arguments"])
            module.add_arguments(p)
        except ModuleNotFoundError:
            pass


def nic_model_from_args(args):
    """The --nic-model flag parsed (None without one); a bad spec raises InvalidArgument naming
    the flag and the key."""
    from ..proxy.nic_model import parse_nic_model
    return parse_nic_model(getattr(args, "nic_model", ""), "--nic-model")


def _apply_nic_model(args) -> None:
    """Hand --nic-model to the ranks' proxies (through UCCL_EP_NIC_MODEL, which every engine's
    proxy start reads); the ranks inherit the environment of this command."""
    import os
    if nic_model_from_args(args) is not None:
        os.environ["UCCL_EP_NIC_MODEL"] = args.nic_model


def _ht_dispatch_kinds(value: str) -> tuple:
    """--ht-dispatch into its kinds, in the order given; an unknown kind is refused naming the flag."""
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    for k in kinds:
        if k not in ("fresh", "worst"):
            from ..errors import InvalidArgument
            raise InvalidArgument("--ht-dispatch", "a comma-separated list of fresh, worst", value)
    return tuple(dict.fromkeys(kinds))


def _spec_from_args(args, on_gpu: bool) -> dict[str, Any]:
    from .. import env
    from ..bench.ep import BenchSpec, spec_to_dict
    from ..tuning import Tuning
    spec = BenchSpec(backend=args.backend, mode=args.mode, num_topk=args.num_topk, num_sms=args.num_sms,
                     check=not args.no_check, seed=args.seed, ll_proxy=args.force_proxy,
                     nodes=getattr(args, "nodes", 0), rdma_chunk=getattr(args, "rdma_chunk", 0),
                     rdma_recv=getattr(args, "rdma_recv", 0), nvl_bytes=getattr(args, "nvl_mb", 0) << 20,
                     nic_model=getattr(args, "nic_model", "") or str(env.get("UCCL_EP_NIC_MODEL")),
                     tune=tuple(getattr(args, "tune", None) or ()),
                     ht_dispatch=_ht_dispatch_kinds(getattr(args, "ht_dispatch", "")))
    Tuning.from_pairs(spec.tune)  # a bad --tune is refused here, before any rank starts
    if getattr(args, "nvl_mb", 0) < 0:
        from ..errors import InvalidArgument
        raise InvalidArgument("--nvl-mb", "MiB >= 0 (0: the configs' size hint)", args.nvl_mb)
    if on_gpu:
        spec.iters, spec.warmup = 20, 5
    else:
        # Small enough that two CPU ranks finish in well under a minute.
        spec.ht_tokens, spec.ll_tokens, spec.hidden = 512, 64, 2048
        spec.ht_experts, spec.ll_experts, spec.iters, spec.warmup = 64, 64, 5, 1
    if args.num_tokens:
        spec.ht_tokens = spec.ll_tokens = args.num_tokens
    if args.hidden:
        spec.hidden = args.hidden
    if args.num_experts:
        spec.ht_experts = spec.ll_experts = args.num_experts
    if args.iters:
        spec.iters = args.iters
    if args.warmup >= 0:
        spec.warmup = args.warmup
    return spec_to_dict(spec)


def _print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title=title)
    for col, justify in (("mode", "left"), ("op", "left"), ("dtype", "left"), ("backend", "left"), ("ranks", "right"),
                         ("tokens", "right"), ("hidden", "right"), ("topk", "right"), ("experts", "right"),
                         ("time µs", "right"), ("GB/s", "right"), ("synced µs", "right"), ("baseline", "left"),
                         ("base µs", "right"), ("base GB/s", "right"), ("vs base", "right"), ("verified", "left")):
        table.add_column(col, justify=justify)
    internode = any("rdma_gbps" in r for r in rows)
    if internode:  # DeepEP's RDMA formula and the bytes the proxy transport really copied
        for col in ("nodes", "RDMA GB/s", "transport MB/op"):
            table.add_column(col, justify="right")
    modelled = any("nic_gbps" in r for r in rows)
    if modelled:  # bytes through the NIC model per op and time, against its cap (bw x nics per rank)
        for col in ("NIC GB/s", "cap GB/s", "of cap", "link idle µs/op", "idle ≥2µs/op", "post→due µs"):
            table.add_column(col, justify="right")
    proxied = any("proxy_hop_us" in r for r in rows)
    if proxied:  # where the proxy path's time goes: writes per op, post->delivery, time in a copy submit
        for col in ("proxy writes/op", "post→deliver µs", "submit µs", "inbox µs", "copy wait µs", "copy µs", "done→seen µs",
                    "push→start µs", "push→seen µs", "push→post µs", "post→seen µs"):
            table.add_column(col, justify="right")
    for r in rows:
        cells = [r["mode"], r["op"], r["dtype"], r["backend"], str(r["ranks"]), str(r["tokens"]), str(r["hidden"]),
                 str(r["topk"]), str(r["experts"]), f"{r['time_s'] * 1e6:.1f}", f"{r['gbps']:.2f}",
                 f"{r['synced_s'] * 1e6:.1f}" if "synced_s" in r else "",
                 r.get("baseline", ""), f"{r.get('baseline_s', 0) * 1e6:.1f}", f"{r.get('baseline_gbps', 0):.2f}",
                 f"{r.get('ratio', 0):.2f}x", r["verified"]]
        if internode:
            cells += [str(r.get("nodes", "")), f"{r['rdma_gbps']:.2f}" if "rdma_gbps" in r else "",
                      f"{r['transport_bytes'] / 1e6:.2f}" if "transport_bytes" in r else ""]
        if modelled:
            cells += [f"{r['nic_gbps']:.2f}" if "nic_gbps" in r else "",
                      f"{r['nic_cap_gbps']:.2f}" if "nic_cap_gbps" in r else "",
                      f"{r['nic_of_cap']:.1%}" if "nic_of_cap" in r else "",
                      f"{r['nic_idle_us']:.1f}" if "nic_idle_us" in r else "",
                      f"{r['nic_idle_gaps']:.1f}" if "nic_idle_gaps" in r else "",
                      f"{r['nic_wait_us']:.1f}" if "nic_wait_us" in r else ""]
        if proxied:
            cells += [f"{r['proxy_writes']:.0f}" if "proxy_writes" in r else "",
                      f"{r['proxy_hop_us']:.1f}" if "proxy_hop_us" in r else "",
                      f"{r['proxy_submit_us']:.1f}" if "proxy_submit_us" in r else ""]
            cells += [f"{r[k]:.1f}" if k in r else "" for k in ("proxy_inbox_us", "copy_wait_us", "copy_us",
                                                                  "done_seen_us", "push_start_us", "push_seen_us",
                                                                  "push_post_us", "post_seen_us")]
        table.add_row(*cells)
    console = Console()
    if not console.is_terminal:
        console = Console(width=260)  # logs and CI: never truncate the table
    console.print(table)


def _merge_ranks(per_rank: list[list[dict[str, Any]]], baseline: str) -> list[dict[str, Any]]:
    """Average times over ranks (bytes are per rank, so GB/s is per rank too, as in DeepEP)."""
    merged = []
    for i, row in enumerate(per_rank[0]):
        same = [rows[i] for rows in per_rank]
        out = dict(row)
        for key in ("time_s", "synced_s", "baseline_s", "bytes", "rdma_bytes", "transport_bytes", "nic_bytes",
                    "nic_wait_us",
                    "proxy_writes",
                    "proxy_hop_us", "proxy_submit_us", "proxy_inbox_us", "copy_wait_us", "copy_us",
                    "done_seen_us", "push_start_us", "push_seen_us", "push_post_us", "post_seen_us"):
            if key in row and all(key in r for r in same):
                out[key] = sum(r[key] for r in same) / len(same)
        out["gbps"] = out["bytes"] / 1e9 / out["time_s"] if out["time_s"] > 0 else 0.0
        if "rdma_bytes" in out:
            out["rdma_gbps"] = out["rdma_bytes"] / 1e9 / out["time_s"] if out["time_s"] > 0 else 0.0
        if "nic_bytes" in out:
            from ..bench.ep import nic_fields
            out.update(nic_fields(out["nic_bytes"], out["time_s"], out["nic_cap_gbps"]))
        if out.get("baseline_s"):
            out["baseline_gbps"] = out["bytes"] / 1e9 / out["baseline_s"]
            out["ratio"] = out["baseline_s"] / out["time_s"]
        out["baseline"] = baseline
        out["verified"] = "ok" if all(r["verified"] == "ok" for r in same) else same[0]["verified"]
        merged.append(out)
    return merged


def _launched_by_env() -> bool:
    import os
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _report(rows: list[dict[str, Any]], device: str, ranks: int, spec: dict, json_path: str | None,
            where: str) -> int:
    _print_table(rows, f"uccl-ep bench: {ranks} x {device}{where}, DeepEP byte formulas, per-rank GB/s")
    if json_path:
        text = json.dumps({"device": device, "ranks": ranks, "spec": spec, "rows": rows}, indent=2)
        if json_path == "-":
            print(text)
        else:
            with open(json_path, "w") as f:
                f.write(text + "\n")
    bad = [r for r in rows if r["verified"] not in ("ok", "skipped")]
    return 1 if bad else 0


def _run_in_job(args) -> int:
    """One rank of a job started by torchrun / srun / the Ray launcher."""
    import datetime
    import os
    import socket

    import torch
    import torch.distributed as dist

    from ..bench.ep import run_rank

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _eager_loading_for_proxy(args)
    _apply_nic_model(args)
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0 and not args.cpu
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=min(args.timeout, 600.0)))
    try:
        spec = _spec_from_args(args, on_gpu)
        rows = run_rank(rank, world, spec, None)
        per_rank: list = [None] * world
        dist.all_gather_object(per_rank, (socket.gethostname(), rows))
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    hosts = sorted({h for h, _ in per_rank})
    merged = _merge_ranks([r for _, r in per_rank], "nccl a2a" if on_gpu else "gloo a2a")
    device = torch.cuda.get_device_name(0) if on_gpu else "CPU"
    return _report(merged, device, world, spec, args.json, f" on {len(hosts)} host(s) {','.join(hosts)}")


def _eager_loading_for_proxy(args) -> None:
    """The GPU proxy paths between GPUs of one host need eager CUDA module loading (see
    uccl_ep.cuda.ll_proxy.warn_lazy_module_loading); set it unless the user chose otherwise."""
    import os
    from .. import env
    forced = bool(env.get("UCCL_EP_FORCE_PROXY"))
    if forced or getattr(args, "force_proxy", False) or getattr(args, "nodes", 0):
        os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")


def run(args) -> int:
    if args.what != "ep":
        module = __import__(BENCH_TARGETS[args.what][0], fromlist=["run"])
        return int(module.run(args) or 0)
    from . import bench_matrix
    if bench_matrix.wants_matrix(args):
        return bench_matrix.run(args)
    if getattr(args, "plot", None):
        print("uccl-ep bench: --plot draws the --matrix results (add --matrix, or --from-json RUN.json)",
              file=sys.stderr)
        return 2
    from ..errors import InvalidArgument
    try:
        nic_model_from_args(args)
        _ht_dispatch_kinds(getattr(args, "ht_dispatch", ""))
    except InvalidArgument as e:
        print(f"uccl-ep bench: {e}", file=sys.stderr)
        return 2
    if args.dist == "env" or (args.dist == "auto" and _launched_by_env()):
        import os
        rc = _run_in_job(args)
        # NOTES: leave without interpreter shutdown. Gloo's worker thread can drop a tensor's
        # Python object after the interpreter has finalized, which aborts the rank ("terminate
        # called without an active exception") and makes torchrun report a failure although the
        # run succeeded. Spawned ranks leave the same way (multiprocessing calls os._exit).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    import torch
    import torch.multiprocessing as mp
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..bench.ep import run_rank
    from ..spawn import run_ranks

    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0 and not args.cpu
    ranks = args.ranks or (torch.cuda.device_count() if on_gpu else 2)
    if on_gpu and ranks > torch.cuda.device_count():
        print(f"uccl-ep bench: --ranks {ranks} > {torch.cuda.device_count()} GPUs", file=sys.stderr)
        return 2
    if ranks < 1:
        print("uccl-ep bench: --ranks must be >= 1", file=sys.stderr)
        return 2
    spec = _spec_from_args(args, on_gpu)
    _eager_loading_for_proxy(args)   # before the ranks start (they inherit the environment)
    _apply_nic_model(args)
    baseline = "nccl a2a" if on_gpu else "gloo a2a"
    queue = mp.get_context("spawn").Queue()
    with Progress(SpinnerColumn(), TextColumn("[bold]uccl-ep bench[/] {task.description}"), TimeElapsedColumn(),
                  transient=True) as progress:
        task = progress.add_task(f"starting {ranks} {'GPU' if on_gpu else 'CPU'} ranks", total=None)

        def drain() -> None:
            while not queue.empty():
                progress.update(task, description=queue.get_nowait())

        per_rank = run_ranks(run_rank, ranks, spec, queue, timeout_s=args.timeout,
                             backend="nccl" if on_gpu else "gloo", on_idle=drain,
                             pg_timeout_s=min(args.timeout, 600.0))
    rows = _merge_ranks(per_rank, baseline)
    device = torch.cuda.get_device_name(0) if on_gpu else "CPU"
    return _report(rows, device, ranks, spec, args.json, "")
