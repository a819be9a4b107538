"""`uccl-ep bench --matrix`: uccl-ep over a grid of shapes, beside NCCL all-to-all and DeepEP.

Grid (each axis can be narrowed from the command line):
- normal mode (ht): tokens x hidden x (top-k, experts) x SMs; three rows per point: cached BF16
  dispatch, cached FP8 dispatch, combine;
- low latency (ll): tokens x hidden x (top-k, experts); rows: FP8 dispatch, combine and
  dispatch + combine called eagerly, and dispatch + combine replayed from one CUDA graph.
Every point is verified for every library (bench/verify.py: bitwise dispatch, combine by DeepEP's
calc_diff) before it is timed. The libraries get the same inputs, the same calls of DeepEP V1's
API and the same timing (bench/timing.py: DeepEP's `bench` method; ht rows report the mean, ll rows
the median, as `uccl-ep bench` does); bytes follow DeepEP's formulas (bench/ep.py), counted from
each library's own outputs. One buffer per library and mode serves every point (sized for the
largest), as a framework's buffer serves every batch.

Budgets: with ``budget_s`` a point starts only when the time used so far plus the longest point
of its mode so far fits; with ``row_budget_s`` an op of a point times fewer calls (or none) when
its calls would not fit in what is left of the point's budget. Whatever is not measured becomes a
row with ``verified = "skipped"`` and its reason in ``note``. Every decision uses times agreed
across ranks (their maximum), so all ranks run the same calls.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..refs.fp8 import per_token_cast_to_fp8
from .deepep import DeepEP, Lib, deepep_lib, find_deepep, uccl_lib
from .ep import _a2a_baseline, _routing
from .matrix_report import derive
from .timing import rank_context, time_op
from .verify import check_ht, check_ll, ht_expected, ll_expected

__all__ = ["MatrixSpec", "run_matrix_rank", "HT_TOKENS", "LL_TOKENS", "HIDDENS", "ROUTINGS", "SMS", "LL_RUNS"]

HT_TOKENS = [128, 512, 1024, 2048, 4096, 8192]
LL_TOKENS = [32, 64, 128, 256]
HIDDENS = [2048, 4096, 5120, 7168]
ROUTINGS = [[6, 64], [8, 128], [8, 256]]
SMS = [24, 12]
LL_RUNS = ["eager", "graph"]
HT_OPS = [("dispatch", "bf16"), ("dispatch", "fp8"), ("combine", "bf16")]
LL_OPS = [("dispatch", "fp8", "eager"), ("combine", "bf16", "eager"), ("dispatch+combine", "fp8+bf16", "eager"),
          ("dispatch+combine", "fp8+bf16", "graph")]


@dataclass
class MatrixSpec:
    backend: str = "auto"
    modes: list = field(default_factory=lambda: ["ht", "ll"])
    ht_tokens: list = field(default_factory=lambda: list(HT_TOKENS))
    ll_tokens: list = field(default_factory=lambda: list(LL_TOKENS))
    hiddens: list = field(default_factory=lambda: list(HIDDENS))
    routings: list = field(default_factory=lambda: [list(r) for r in ROUTINGS])
    sms: list = field(default_factory=lambda: list(SMS))
    ll_runs: list = field(default_factory=lambda: list(LL_RUNS))
    iters: int = 20
    warmup: int = 5
    synced_iters: int = 10
    seed: int = 0
    check: bool = True
    budget_s: float = 0.0       # whole matrix (0: unbounded)
    row_budget_s: float = 0.0   # each point, every library and op of it (0: unbounded)
    deepep: str = "auto"        # auto | off | require
    partial_path: str = ""      # rank 0 appends each point's rows (its own times) here as JSON lines
    tune: list = field(default_factory=list)  # uccl-ep's Tuning as key=value texts (--tune); [] = the defaults


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Run:
    def __init__(self, spec: MatrixSpec, group, rank: int, world: int, device, progress: Callable[[str], None]):
        self.spec, self.group, self.rank, self.world, self.device, self.progress = \
            spec, group, rank, world, device, progress
        self.t0 = time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self.longest = {"ht": 0.0, "ll": 0.0}
        self.backend = ""
        self.baseline = "nccl a2a" if device.type == "cuda" else "gloo a2a"

    # -- agreement and budgets --------------------------------------------------------------------
    def agree(self, value: float) -> float:
        """The maximum of ``value`` over the ranks (every budget decision uses it)."""
        dev = self.device if self.device.type == "cuda" else torch.device("cpu")
        t = torch.tensor([float(value)], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def gate(self, mode: str) -> str | None:
        """Why the next point of ``mode`` must be skipped under the overall budget, or None."""
        if not self.spec.budget_s:
            return None
        used = self.agree(time.monotonic() - self.t0)
        if used + self.longest[mode] > self.spec.budget_s:
            return (f"overall budget {self.spec.budget_s:g} s: {used:.0f} s used, a {mode} point took up to "
                    f"{self.longest[mode]:.1f} s")
        return None

    def timed(self, fn, row_t0: float) -> tuple[dict | None, str]:
        """``time_op`` of ``fn`` within the point's budget: (timings or None, note)."""
        spec = self.spec
        _sync(self.device)
        start = time.perf_counter()
        fn()
        _sync(self.device)
        one = self.agree(time.perf_counter() - start)
        warmup, iters, synced = spec.warmup, spec.iters, spec.synced_iters
        note = ""
        if spec.row_budget_s:
            left = spec.row_budget_s - self.agree(time.monotonic() - row_t0)
            fits = int(left / max(one, 1e-9))
            if fits < warmup + iters + synced:
                if fits < 5:
                    return None, (f"row budget {spec.row_budget_s:g} s: one call took {one * 1e3:.1f} ms, "
                                  f"{max(left, 0.0):.1f} s left")
                warmup, synced = min(warmup, 1), min(synced, 1)
                iters = max(2, min(iters, fits - warmup - synced))
                note = f"{iters} timed calls (row budget)"
        t = time_op(fn, iters, warmup, self.device, self.group, synced_iters=synced)
        t["iters"] = iters
        return t, note

    def a2a(self, per_dest: list[int], row_bytes: int) -> float:
        """Mean seconds of one all-to-all moving ``per_dest[r] * row_bytes`` to each rank r (collective:
        every rank calls it once per point and op, whatever its own counts)."""
        return _a2a_baseline(self.group, per_dest, row_bytes, self.device,
                             SimpleNamespace(iters=self.spec.iters, warmup=self.spec.warmup))

    def _inputs(self, T: int, H: int, K: int, E: int, salt: int):
        seed = zlib.crc32(repr((self.spec.seed, salt, T, H, K, E, self.rank)).encode())
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(self.device)
        topk_idx, topk_weights = _routing(T, E, K, self.device, gen)
        return x, topk_idx, topk_weights

    def _per_dest(self, topk_idx: torch.Tensor, E: int) -> tuple[list[int], list[int]]:
        """Distinct tokens for each rank, and (token, expert) selections for each rank."""
        dest = topk_idx.div(E // self.world, rounding_mode="floor")
        tokens = [int(((topk_idx >= 0) & (dest == r)).any(1).sum()) for r in range(self.world)]
        sel = [int(((topk_idx >= 0) & (dest == r)).sum()) for r in range(self.world)]
        return tokens, sel

    def _recv_counts(self, per_dest: list[int]) -> list[int]:
        dev = self.device if self.device.type == "cuda" else torch.device("cpu")
        send = torch.tensor(per_dest, dtype=torch.int64, device=dev)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        return [int(v) for v in recv.tolist()]

    def emit(self, rows: list[dict]) -> None:
        rows = [derive(dict(r)) for r in rows]
        self.rows.extend(rows)
        if self.rank == 0 and self.spec.partial_path:
            with open(self.spec.partial_path, "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")

    def _row(self, mode: str, shape: tuple, op: str, dtype: str, run: str, **kw) -> dict:
        T, H, K, E = shape
        row = dict(mode=mode, op=op, dtype=dtype, run=run, tokens=T, hidden=H, topk=K, experts=E,
                   backend=self.backend, ranks=self.world, device=self.device.type, baseline=self.baseline)
        if self.spec.tune:
            row["tune"] = " ".join(self.spec.tune)
        row.update(kw)
        return row

    @staticmethod
    def _fill(row: dict, name: str, res: dict | None) -> None:
        """Put one library's result for one op into ``row`` (uccl-ep: the plain keys; DeepEP: deepep_*)."""
        if res is None:
            return
        stat = "mean" if row["mode"] == "ht" else "median"
        t = res.get("t")
        if name == "uccl-ep":
            row["verified"] = res["verified"] if t is not None else "skipped"
            row["note"] = "; ".join(s for s in (row.get("note", ""), res.get("note", "")) if s)
            if t is not None:
                row.update(bytes=res["bytes"], time_s=t[stat], synced_s=t.get("synced_mean", 0.0), iters=t["iters"])
        else:
            row["deepep_verified"] = res["verified"] if t is not None else "skipped"
            if res.get("note"):
                row["deepep_note"] = res["note"]
            if t is not None:
                row.update(deepep_bytes=res["bytes"], deepep_s=t[stat], deepep_synced_s=t.get("synced_mean", 0.0))

    # -- normal mode ------------------------------------------------------------------------------
    def ht(self, libs: list[Lib]) -> None:
        spec, world = self.spec, self.world
        h_max, sms_max = max(spec.hiddens), max(spec.sms)
        bufs = {}
        for lib in libs:
            lib.Buffer.set_num_sms(sms_max)
            d, c = lib.Buffer.get_dispatch_config(world), lib.Buffer.get_combine_config(world)
            nvl = max(d.get_nvl_buffer_size_hint(h_max * 2, world), c.get_nvl_buffer_size_hint(h_max * 2, world))
            bufs[lib.name] = lib.ht_buffer(self.group, nvl)
        self.backend = str(getattr(bufs["uccl-ep"], "backend", ""))
        for K, E in spec.routings:
            for H in spec.hiddens:
                for T in spec.ht_tokens:
                    shape = (T, H, K, E)
                    reason = self.gate("ht")
                    if reason:
                        self.emit([self._row("ht", shape, op, dt, f"{s} SMs", num_sms=s, verified="skipped",
                                             note=reason) for s in spec.sms for op, dt in HT_OPS])
                        continue
                    row_t0 = time.monotonic()
                    self.progress(f"ht {T} x {H}, top-{K}/{E}")
                    self._ht_point(libs, bufs, shape, row_t0)
                    self.longest["ht"] = max(self.longest["ht"], self.agree(time.monotonic() - row_t0))

    def _ht_point(self, libs: list[Lib], bufs: dict, shape: tuple, row_t0: float) -> None:
        T, H, K, E = shape
        x, topk_idx, topk_weights = self._inputs(T, H, K, E, 1)
        x_fp8 = per_token_cast_to_fp8(x)
        exp = ht_expected(x, x_fp8, topk_idx, self.group, self.rank, E, self.world) if self.spec.check else None
        per_dest, _ = self._per_dest(topk_idx, E)
        back = self._recv_counts(per_dest)
        base = {("dispatch", "bf16"): self.a2a(per_dest, H * 2),
                ("dispatch", "fp8"): self.a2a(per_dest, H + H // 128 * 4),
                ("combine", "bf16"): self.a2a(back, H * 2)}
        for sms in self.spec.sms:
            results = {}
            for lib in libs:
                results[lib.name] = self._guarded(lib, lambda: self._ht_lib(lib, bufs[lib.name], sms, x, x_fp8,
                                                                             topk_idx, topk_weights, E, exp, row_t0),
                                                  HT_OPS)
            rows = []
            for op, dt in HT_OPS:
                row = self._row("ht", shape, op, dt, f"{sms} SMs", num_sms=sms, baseline_s=base[(op, dt)])
                for name, res in results.items():
                    self._fill(row, name, res[(op, dt)])
                rows.append(row)
            self.emit(rows)

    def _guarded(self, lib: Lib, fn, ops) -> dict:
        """uccl-ep's errors end the run (its state is unknown); a baseline's error becomes a note."""
        if lib.name == "uccl-ep":
            return fn()
        try:
            return fn()
        except Exception as e:  # noqa: BLE001  a failing baseline is reported, never fatal
            _sync(self.device)
            note = f"error: {type(e).__name__}: {str(e)[:160]}"
            return {op: dict(t=None, verified="error", note=note) for op in ops}

    def _ht_lib(self, lib: Lib, buf, sms: int, x, x_fp8, topk_idx, topk_weights, E: int, exp, row_t0) -> dict:
        H = x.shape[1]
        lib.Buffer.set_num_sms(sms)
        dcfg, ccfg = lib.Buffer.get_dispatch_config(self.world), lib.Buffer.get_combine_config(self.world)
        ntpr, ntprr, ntpe, in_rank, _ = buf.get_dispatch_layout(topk_idx, E)
        recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights,
                                                  num_tokens_per_rank=ntpr, num_tokens_per_rdma_rank=ntprr,
                                                  is_token_in_rank=in_rank, num_tokens_per_expert=ntpe, config=dcfg)
        recv_fp8, *_ = buf.dispatch(x_fp8, handle=handle, config=dcfg)
        combined, _, _ = buf.combine(recv_x, handle, config=ccfg)
        _sync(self.device)
        verified = "skipped"
        if exp is not None:
            try:
                check_ht(lib.name, self.rank, exp, recv_x, recv_fp8, combined)
                verified = "ok"
            except AssertionError as e:
                verified = f"FAILED: {e}"
        bf16 = recv_x.shape[0] * H * 2
        calls = {("dispatch", "bf16"): (bf16, lambda: buf.dispatch(x, handle=handle, config=dcfg)),
                 ("dispatch", "fp8"): (bf16 * (1 + 4 / 128) / 2, lambda: buf.dispatch(x_fp8, handle=handle,
                                                                                        config=dcfg)),
                 ("combine", "bf16"): (bf16, lambda: buf.combine(recv_x, handle, config=ccfg))}
        out = {}
        for key, (nbytes, fn) in calls.items():
            t, note = self.timed(fn, row_t0)
            out[key] = dict(bytes=nbytes, t=t, note=note, verified=verified)
        return out

    # -- low latency ------------------------------------------------------------------------------
    def ll(self, libs: list[Lib]) -> None:
        spec, world = self.spec, self.world
        t_max, h_max, e_max = max(spec.ll_tokens), max(spec.hiddens), max(e for _, e in spec.routings)
        bufs = {}
        for lib in libs:
            rdma = lib.Buffer.get_low_latency_rdma_size_hint(t_max, h_max, world, e_max)
            bufs[lib.name] = lib.ll_buffer(self.group, rdma, max(1, e_max // world))
        self.backend = str(getattr(bufs["uccl-ep"], "backend", ""))
        ops = [o for o in LL_OPS if o[2] in spec.ll_runs]
        for K, E in spec.routings:
            for H in spec.hiddens:
                for T in spec.ll_tokens:
                    shape = (T, H, K, E)
                    reason = self.gate("ll")
                    if reason:
                        self.emit([self._row("ll", shape, op, dt, run, verified="skipped", note=reason)
                                   for op, dt, run in ops])
                        continue
                    row_t0 = time.monotonic()
                    self.progress(f"ll {T} x {H}, top-{K}/{E}")
                    self._ll_point(libs, bufs, shape, ops, row_t0)
                    self.longest["ll"] = max(self.longest["ll"], self.agree(time.monotonic() - row_t0))

    def _ll_point(self, libs: list[Lib], bufs: dict, shape: tuple, ops: list, row_t0: float) -> None:
        T, H, K, E = shape
        x, topk_idx, topk_weights = self._inputs(T, H, K, E, 2)
        exp = ll_expected(x, topk_idx, topk_weights, self.group) if self.spec.check else None
        _, sel = self._per_dest(topk_idx, E)
        base = self.a2a(sel, H * 2)
        results = {lib.name: self._guarded(lib, lambda: self._ll_lib(lib, bufs[lib.name], shape, x, topk_idx,
                                                                     topk_weights, exp, ops, row_t0),
                                           [(op, run) for op, _, run in ops])
                   for lib in libs}
        rows = []
        for op, dt, run in ops:
            row = self._row("ll", shape, op, dt, run, baseline_s=base * (2 if "+" in op else 1))
            for name, res in results.items():
                self._fill(row, name, res[(op, run)])
            rows.append(row)
        self.emit(rows)

    def _ll_lib(self, lib: Lib, buf, shape: tuple, x, topk_idx, topk_weights, exp, ops: list, row_t0) -> dict:
        T, H, K, E = shape
        buf.clean_low_latency_buffer(T, H, E)  # the layout moves with (T, H, E): DeepEP needs it, uccl-ep allows it
        (q, _), cnt, handle, _, _ = buf.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)
        _sync(self.device)
        q, cnt, handle = q.cpu(), cnt.cpu(), (handle[0].cpu(), handle[1].cpu(), *handle[2:])
        bx, bcnt, bhandle, _, _ = buf.low_latency_dispatch(x, topk_idx, T, E, use_fp8=False)
        y = bx.clone()
        combined, _, _ = buf.low_latency_combine(y, topk_idx, topk_weights, bhandle)
        _sync(self.device)
        verified = "skipped"
        if exp is not None:
            try:
                check_ll(lib.name, self.rank, exp, E, self.world, bx, bcnt, bhandle, q, cnt, handle,
                         combined)
                verified = "ok"
            except AssertionError as e:
                verified = f"FAILED: {e}"
        num_sel = int((topk_idx >= 0).sum())
        d_bytes, c_bytes = num_sel * (H + H // 128 * 4 + 16), num_sel * H * 2

        def dispatch():
            return buf.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)

        def step():
            _, _, h, _, _ = buf.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)
            buf.low_latency_combine(y, topk_idx, topk_weights, h)

        out = {}
        for op, _, run in ops:
            nbytes = {"dispatch": d_bytes, "combine": c_bytes}.get(op, d_bytes + c_bytes)
            if run == "graph":
                if not lib.can_graph(buf, self.device):
                    out[(op, run)] = dict(t=None, verified="skipped",
                                          note="CUDA graph: needs a GPU (and for uccl-ep the cuda backend)")
                    continue
                fn = self._capture(step)
            else:
                fn = {"dispatch": dispatch, "combine": lambda: buf.low_latency_combine(y, topk_idx, topk_weights,
                                                                                        bhandle)}.get(op, step)
            t, note = self.timed(fn, row_t0)
            out[(op, run)] = dict(bytes=nbytes, t=t, note=note, verified=verified)
        return out

    def _capture(self, step) -> Callable[[], None]:
        """``step`` captured in one CUDA graph; its replay."""
        dist.barrier(group=self.group)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            step()
        torch.cuda.synchronize()
        dist.barrier(group=self.group)
        return graph.replay


def run_matrix_rank(rank: int, world: int, spec_dict: dict, progress_queue: Any = None) -> dict[str, Any]:
    """Body of one rank of the matrix (the process group is already initialized)."""
    spec = MatrixSpec(**spec_dict)
    group, device, progress = rank_context(rank, progress_queue)

    found = find_deepep() if spec.deepep != "off" else DeepEP(None, "not asked for (--deepep off)")
    run = _Run(spec, group, rank, world, device, progress)
    if run.agree(0.0 if found.found else 1.0) > 0 and found.found:  # every rank, or none, runs DeepEP
        found = DeepEP(None, "DeepEP imports on some ranks only")
    if spec.deepep == "require" and not found.found:
        raise RuntimeError(f"--deepep require: {found.reason}")
    libs = [uccl_lib(spec.backend, spec.tune)] + ([deepep_lib(found)] if found.found else [])
    if "ht" in spec.modes:
        run.ht(libs)
    if "ll" in spec.modes:
        run.ll(libs)
    # NOTES: only after a clean run: DeepEP's destroy() synchronizes with its peers, which would
    # hang behind a rank that failed; a failed rank's process ends instead.
    _sync(device)
    dist.barrier(group=group)
    for lib in libs:
        lib.destroy()
    progress("done")
    return dict(rows=run.rows, deepep=found.reason, deepep_found=found.found, deepep_version=found.version)


def spec_to_dict(spec: MatrixSpec) -> dict:
    return asdict(spec)
