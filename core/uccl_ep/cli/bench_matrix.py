"""`uccl-ep bench --matrix`: the shape matrix beside NCCL and DeepEP (uccl_ep.bench.matrix).

    uccl-ep bench --matrix                       # normal mode and low latency, every point
    uccl-ep bench --matrix ht --matrix-sms 24    # a subset
    uccl-ep bench --matrix ll --matrix-tokens 128 --matrix-hidden 7168 --matrix-routing 8x256
    uccl-ep bench --matrix --matrix-budget 480 --json run.json --plot run.png
    uccl-ep bench --from-json run.json --plot run.png   # table and plot again, from a saved run
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ..errors import InvalidArgument
from ..tuning import Tuning

__all__ = ["add_arguments", "wants_matrix", "run"]

# Flags of the single-shape bench that mean nothing to the matrix (it has its own axes).
_SINGLE_SHAPE = (("num_tokens", 0, "--num-tokens", "--matrix-tokens"), ("hidden", 0, "--hidden", "--matrix-hidden"),
                 ("num_experts", 0, "--num-experts", "--matrix-routing"),
                 ("num_topk", 8, "--num-topk", "--matrix-routing"), ("num_sms", 24, "--num-sms", "--matrix-sms"),
                 ("force_proxy", False, "--force-proxy", None), ("nodes", 0, "--nodes", None))


def add_arguments(p) -> None:
    g = p.add_argument_group("shape matrix (--matrix)")
    g.add_argument("--matrix", nargs="?", const="all", choices=["all", "ht", "ll"],
                   help="run the shape matrix (normal mode: tokens x hidden x top-k/experts x SMs; low latency: "
                        "tokens x hidden x top-k/experts, eager and CUDA graph), each point verified, beside NCCL "
                        "all-to-all and DeepEP when the real `deep_ep` imports")
    g.add_argument("--matrix-tokens", metavar="LIST", help="tokens per rank, e.g. 128,512 (default: ht "
                   "128..8192, ll 32..256)")
    g.add_argument("--matrix-hidden", metavar="LIST", help="hidden sizes, e.g. 4096,7168 (default 2048,4096,5120,7168)")
    g.add_argument("--matrix-routing", metavar="LIST", help="top-k x experts pairs, e.g. 6x64,8x256 "
                   "(default 6x64,8x128,8x256)")
    g.add_argument("--matrix-sms", metavar="LIST", help="SMs of normal-mode kernels (default 24,12)")
    g.add_argument("--matrix-ll-runs", metavar="LIST", help="low-latency runs: eager,graph (default both)")
    g.add_argument("--matrix-budget", type=float, default=0.0, metavar="S",
                   help="seconds for the whole matrix: a point starts only if the longest point of its mode so "
                        "far still fits; the rest is listed as skipped (default: no limit)")
    g.add_argument("--matrix-row-budget", type=float, default=0.0, metavar="S",
                   help="seconds per point (all libraries and ops): ops time fewer calls, or none, when theirs "
                        "would not fit (default: no limit)")
    g.add_argument("--deepep", default="auto", choices=["auto", "off", "require"],
                   help="DeepEP baseline: when the real library imports (auto), never, or fail without it")
    g.add_argument("--plot", metavar="PNG", help="matrix: heat maps of the ratio to DeepEP (needs matplotlib)")
    g.add_argument("--from-json", metavar="PATH", help="print the table (and --plot) of a saved --matrix --json run")


def wants_matrix(args) -> bool:
    return bool(getattr(args, "matrix", None) or getattr(args, "from_json", None))


def _ints(value: str | None, flag: str, default: list) -> list:
    if value is None:
        return list(default)
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or any(v <= 0 for v in out):
        raise InvalidArgument(flag, "a comma-separated list of positive integers", value)
    return out


def _routings(value: str | None, default: list) -> list:
    if value is None:
        return [list(r) for r in default]
    out = []
    for item in value.split(","):
        k, _, e = item.strip().lower().partition("x")
        if not (k.isdigit() and e.isdigit() and int(k) > 0 and int(e) > 0):
            raise InvalidArgument("--matrix-routing", "comma-separated TOPKxEXPERTS pairs such as 6x64,8x256", value)
        out.append([int(k), int(e)])
    return out


def spec_from_args(args, on_gpu: bool) -> dict[str, Any]:
    """The MatrixSpec of the command line; InvalidArgument names a bad flag."""
    from ..bench import matrix as m
    for attr, default, flag, instead in _SINGLE_SHAPE:
        if getattr(args, attr, default) != default:
            raise InvalidArgument(flag, "no single-shape flag with --matrix" + (f" (use {instead})" if instead else ""),
                                  getattr(args, attr))
    modes = ["ht", "ll"] if args.matrix == "all" else [args.matrix]
    tokens = args.matrix_tokens
    runs = m.LL_RUNS if args.matrix_ll_runs is None else [v.strip() for v in args.matrix_ll_runs.split(",")]
    if not runs or any(r not in m.LL_RUNS for r in runs):
        raise InvalidArgument("--matrix-ll-runs", "a comma-separated subset of eager,graph", args.matrix_ll_runs)
    sms = _ints(args.matrix_sms, "--matrix-sms", m.SMS)
    if any(s % 2 for s in sms):
        raise InvalidArgument("--matrix-sms", "even SM counts (one channel = 2 SMs)", args.matrix_sms)
    for flag, v in (("--matrix-budget", args.matrix_budget), ("--matrix-row-budget", args.matrix_row_budget)):
        if v < 0:
            raise InvalidArgument(flag, "seconds >= 0 (0: no limit)", v)
    tune = list(getattr(args, "tune", None) or ())
    Tuning.from_pairs(tune)  # a bad --tune is refused here, naming the key, before any rank starts
    spec = m.MatrixSpec(backend=args.backend, modes=modes, ht_tokens=_ints(tokens, "--matrix-tokens", m.HT_TOKENS),
                        ll_tokens=_ints(tokens, "--matrix-tokens", m.LL_TOKENS),
                        hiddens=_ints(args.matrix_hidden, "--matrix-hidden", m.HIDDENS),
                        routings=_routings(args.matrix_routing, m.ROUTINGS), sms=sms, ll_runs=runs,
                        seed=args.seed, check=not args.no_check, budget_s=args.matrix_budget,
                        row_budget_s=args.matrix_row_budget, deepep=args.deepep, tune=tune)
    for k, e in spec.routings:
        if e % 2 or k > e:
            raise InvalidArgument("--matrix-routing", "top-k <= experts, experts divisible by the ranks", f"{k}x{e}")
    spec.iters, spec.warmup = (20, 5) if on_gpu else (3, 1)
    if args.iters:
        spec.iters = args.iters
    if args.warmup >= 0:
        spec.warmup = args.warmup
    spec.synced_iters = min(spec.iters, 10)
    if args.json and args.json != "-":
        spec.partial_path = args.json + ".partial.jsonl"
    return m.spec_to_dict(spec)


def _report(result: dict, json_path: str | None, plot_path: str | None) -> int:
    from ..bench.matrix_report import print_table, report_plot, write_json
    rows = result["rows"]
    title = (f"uccl-ep bench --matrix: {result['ranks']} x {result['device']}, DeepEP byte formulas, per-rank GB/s, "
             f"baseline {rows[0]['baseline'] if rows else ''}")
    if rows and rows[0].get("tune"):
        title += f", uccl-ep with --tune {rows[0]['tune']}"
    print_table(rows, title, result.get("deepep", ""))
    if json_path:
        write_json(json_path, result)
    if plot_path:
        report_plot(rows, plot_path, title)
    return 1 if any(r.get("verified") not in ("ok", "skipped") for r in rows) else 0


def run(args) -> int:
    if args.from_json:
        with open(args.from_json) as f:
            return _report(json.load(f), None, args.plot)
    if args.dist == "env" or (args.dist == "auto" and all(
            k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))):
        print("uccl-ep bench: --matrix spawns its own local ranks; run it without torchrun/srun (or pass "
              "--dist spawn)", file=sys.stderr)
        return 2
    import torch

    from ..bench.matrix import run_matrix_rank
    from ..bench.matrix_report import merge_ranks
    from ..spawn import run_ranks
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0 and not args.cpu
    try:
        spec = spec_from_args(args, on_gpu)
    except InvalidArgument as e:
        print(f"uccl-ep bench: {e}", file=sys.stderr)
        return 2
    if spec["deepep"] == "require":
        from ..bench.deepep import find_deepep
        found = find_deepep()
        if not found.found:
            print(f"uccl-ep bench: --deepep require: {found.reason}", file=sys.stderr)
            return 2
    ranks = args.ranks or (torch.cuda.device_count() if on_gpu else 2)
    if ranks < 1 or (on_gpu and ranks > torch.cuda.device_count()):
        print(f"uccl-ep bench: --ranks {ranks}: expected 1..{torch.cuda.device_count() if on_gpu else 'N'}",
              file=sys.stderr)
        return 2
    if spec["partial_path"] and os.path.exists(spec["partial_path"]):
        os.remove(spec["partial_path"])
    timeout = max(args.timeout, spec["budget_s"] + 240.0)
    import torch.multiprocessing as mp
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    queue = mp.get_context("spawn").Queue()
    with Progress(SpinnerColumn(), TextColumn("[bold]uccl-ep bench --matrix[/] {task.description}"),
                  TimeElapsedColumn(), transient=True) as progress:
        task = progress.add_task(f"starting {ranks} {'GPU' if on_gpu else 'CPU'} ranks", total=None)

        def drain() -> None:
            while not queue.empty():
                progress.update(task, description=queue.get_nowait())

        per_rank = run_ranks(run_matrix_rank, ranks, spec, queue, timeout_s=timeout,
                             backend="nccl" if on_gpu else "gloo", on_idle=drain,
                             pg_timeout_s=min(timeout, 600.0))
    result = dict(device=torch.cuda.get_device_name(0) if on_gpu else "CPU", ranks=ranks, spec=spec,
                  deepep=per_rank[0]["deepep"], deepep_found=per_rank[0]["deepep_found"],
                  deepep_version=per_rank[0]["deepep_version"], rows=merge_ranks([r["rows"] for r in per_rank]))
    rc = _report(result, args.json, args.plot)
    if spec["partial_path"] and os.path.exists(spec["partial_path"]):
        os.remove(spec["partial_path"])  # the full JSON is written
    return rc
