"""The EP benchmark run on each rank: verify, time, and compare with an all-to-all baseline.

Byte formulas are DeepEP's (the bandwidth accounting of its tests):
- normal mode: bytes = received rows (including the rank's own tokens) x hidden x 2 for BF16;
  FP8 = BF16 bytes x (1 + 4/128) / 2; combine uses the BF16 count;
- low-latency: per valid (token, expert) selection sent: FP8 hidden + hidden/128*4 + 16,
  BF16 2*hidden; combine 2*hidden;
- internode normal mode (``nodes`` > 1, or a group that spans hosts): also DeepEP's "RDMA"
  bytes = (token, distinct destination node) pairs, this rank's own node included, x hidden x 2
  (same FP8 factor), and the bytes the proxy transport really copied per op where the backend
  reports them (``transport_bytes``: rows plus their scales/top-k/index fields, own node included).
  Times follow DeepEP's ``bench`` (bench/timing.py): calls back to back between CUDA events, one
  synchronize at the end, first sample dropped; not its kernel-only kineto time.
Every row also carries ``synced_s``: the mean of calls synchronized one by one (the whole call as a
caller that waits for each sees it, host path included).
The baseline moves the same per-destination bytes with one `all_to_all_single` (NCCL on GPU,
gloo on CPU) in the same run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import Buffer, utils
from ..config import Config
from ..tuning import Tuning
from ..refs import logfmt
from ..refs.fp8 import per_token_cast_to_fp8
from .timing import rank_context, time_op
from .verify import check_ht, check_ll, ht_expected, ll_expected

__all__ = ["BenchSpec", "run_rank", "nic_fields"]


@dataclass
class BenchSpec:
    backend: str = "auto"
    mode: str = "both"            # "ht" | "ll" | "both"
    ht_tokens: int = 4096
    ll_tokens: int = 128
    hidden: int = 7168
    num_topk: int = 8
    ht_experts: int = 256
    ll_experts: int = 288
    iters: int = 20
    warmup: int = 5
    check: bool = True
    seed: int = 0
    num_sms: int = 24
    ll_proxy: bool = False        # LL through the CPU proxy (allow_nvlink_for_low_latency_mode=False)
    nodes: int = 0                # > 0: ranks_per_node = ranks / nodes (e.g. 2 GPUs of one host as 2 nodes)
    rdma_chunk: int = 0           # > 0: Config.num_max_rdma_chunked_send_tokens of both ops (default: the table's)
    rdma_recv: int = 0            # > 0: Config.num_max_rdma_chunked_recv_tokens of both ops
    nvl_bytes: int = 0            # > 0: the NVL buffer's bytes (else the configs' hint)
    nic_model: str = ""           # the NIC model the proxies run under (UCCL_EP_NIC_MODEL), for the cap column
    tune: tuple = ()              # "key=value" items of uccl_ep.Tuning for every Buffer (--tune)
    ht_dispatch: tuple = ()       # normal-mode dispatch rows besides the cached one: "fresh", "worst" (--ht-dispatch)


def _routing(num_tokens: int, num_experts: int, num_topk: int, device, gen: torch.Generator):
    scores = torch.randn(num_tokens, num_experts, generator=gen).abs() + 1
    topk_idx = scores.topk(num_topk, dim=-1, sorted=False).indices.to(device)
    topk_weights = torch.rand(num_tokens, num_topk, generator=gen).to(device)
    return topk_idx, topk_weights


class _Rows:
    def __init__(self, spec: BenchSpec, world: int, backend: str, device: torch.device) -> None:
        self.rows: list[dict[str, Any]] = []
        self.common = dict(backend=backend, ranks=world, hidden=spec.hidden, topk=spec.num_topk,
                           device=device.type)

    def add(self, **kw: Any) -> None:
        row = dict(self.common)
        row.update(kw)
        t, bt = row["time_s"], row.get("baseline_s")
        row["gbps"] = row["bytes"] / 1e9 / t if t > 0 else 0.0
        if bt:
            row["baseline_gbps"] = row["bytes"] / 1e9 / bt
            row["ratio"] = bt / t if t > 0 else 0.0
        self.rows.append(row)


def _a2a_baseline(group, per_dest_rows: list[int], row_bytes: int, device, spec: BenchSpec) -> float:
    """Mean seconds of one all_to_all_single moving ``per_dest_rows[r] * row_bytes`` to each r."""
    send_sizes = [n * row_bytes for n in per_dest_rows]
    sizes = torch.tensor(send_sizes, dtype=torch.int64, device=device)
    recv = torch.empty_like(sizes)
    dist.all_to_all_single(recv, sizes, group=group)
    recv_sizes = [int(v) for v in recv.tolist()]
    send = torch.zeros(sum(send_sizes), dtype=torch.uint8, device=device)
    out = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=device)
    return time_op(lambda: dist.all_to_all_single(out, send, recv_sizes, send_sizes, group=group),
                   spec.iters, spec.warmup, device, group)["mean"]


def _with_rdma(cfg: Config, spec: BenchSpec) -> Config:
    """``cfg`` with the bench's RDMA chunk / ring overrides (DeepEP's tuning knobs of internode runs)."""
    if not (spec.rdma_chunk or spec.rdma_recv):
        return cfg
    return Config(cfg.num_sms, cfg.num_max_nvl_chunked_send_tokens, cfg.num_max_nvl_chunked_recv_tokens,
                  spec.rdma_chunk or cfg.num_max_rdma_chunked_send_tokens,
                  spec.rdma_recv or cfg.num_max_rdma_chunked_recv_tokens)


def _bench_ht(spec: BenchSpec, group, rank: int, world: int, device, rows: _Rows, progress: Callable[[str], None]):
    gen = torch.Generator().manual_seed(spec.seed * 1000 + rank)
    T, H, K, E = spec.ht_tokens, spec.hidden, spec.num_topk, spec.ht_experts
    Buffer.set_num_sms(spec.num_sms)
    dcfg, ccfg = (_with_rdma(c, spec) for c in (Buffer.get_dispatch_config(world), Buffer.get_combine_config(world)))
    nvl = spec.nvl_bytes or max(dcfg.get_nvl_buffer_size_hint(H * 2, world), ccfg.get_nvl_buffer_size_hint(H * 2, world))
    rdma = max(dcfg.get_rdma_buffer_size_hint(H * 2, world), ccfg.get_rdma_buffer_size_hint(H * 2, world))
    buf = Buffer(group, nvl, rdma, backend=spec.backend, ranks_per_node=_ranks_per_node(spec, world),
                 tuning=Tuning.from_pairs(spec.tune))
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(device)
    topk_idx, topk_weights = _routing(T, E, K, device, gen)
    ntpr, ntprr, ntpe, in_rank, _ = buf.get_dispatch_layout(topk_idx, E)
    internode = _InternodeRows(buf, ntprr, H, spec)
    kwargs = dict(num_tokens_per_rank=ntpr, num_tokens_per_rdma_rank=ntprr, is_token_in_rank=in_rank,
                  num_tokens_per_expert=ntpe)
    recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights,
                                                               config=dcfg, **kwargs)
    x_fp8 = per_token_cast_to_fp8(x)
    recv_fp8, *_ = buf.dispatch(x_fp8, handle=handle, config=dcfg)
    combined, _, _ = buf.combine(recv_x, handle, config=ccfg)
    verified = "skipped"
    if spec.check:
        progress("ht: verifying")
        check_ht("uccl-ep", rank, ht_expected(x, x_fp8, topk_idx, group, rank, E, world), recv_x, recv_fp8, combined)
        verified = "ok"
    n_recv = recv_x.shape[0]
    bf16_bytes = n_recv * H * 2
    per_dest = ntpr.tolist()
    progress("ht: timing dispatch bf16")
    t_bf16 = internode.timed(lambda: buf.dispatch(x, handle=handle, config=dcfg), device, group)
    base_bf16 = _a2a_baseline(group, per_dest, H * 2, device, spec)
    rows.add(mode="ht", op="dispatch", dtype="bf16", tokens=T, experts=E, bytes=bf16_bytes, time_s=t_bf16["mean"],
             synced_s=t_bf16["synced_mean"], baseline_s=base_bf16, verified=verified,
             **internode.fields(1.0, t_bf16["mean"]))
    progress("ht: timing dispatch fp8")
    t_fp8 = internode.timed(lambda: buf.dispatch(x_fp8, handle=handle, config=dcfg), device, group)
    fp8_row = H + H // 128 * 4
    base_fp8 = _a2a_baseline(group, per_dest, fp8_row, device, spec)
    rows.add(mode="ht", op="dispatch", dtype="fp8", tokens=T, experts=E, bytes=bf16_bytes * (1 + 4 / 128) / 2,
             time_s=t_fp8["mean"], synced_s=t_fp8["synced_mean"], baseline_s=base_fp8, verified=verified,
             **internode.fields((1 + 4 / 128) / 2, t_fp8["mean"]))
    progress("ht: timing combine")
    t_comb = internode.timed(lambda: buf.combine(recv_x, handle, config=ccfg), device, group)
    recv_counts = [int(v) for v in handle.plan.recv_counts] if hasattr(handle.plan, "recv_counts") else per_dest
    base_comb = _a2a_baseline(group, recv_counts, H * 2, device, spec)
    rows.add(mode="ht", op="combine", dtype="bf16", tokens=T, experts=E, bytes=bf16_bytes, time_s=t_comb["mean"],
             synced_s=t_comb["synced_mean"], baseline_s=base_comb, verified=verified,
             **internode.fields(1.0, t_comb["mean"]))
    for variant in spec.ht_dispatch:
        fresh = dict(kwargs, topk_idx=topk_idx, topk_weights=topk_weights, config=dcfg)
        if variant == "worst":  # DeepEP's bound: every token of every rank; no host wait for the counts
            fresh["num_worst_tokens"] = T * world
        for dtype, xs, base, factor in (("bf16", x, base_bf16, 1.0), ("fp8", x_fp8, base_fp8, (1 + 4 / 128) / 2)):
            progress(f"ht: timing dispatch {variant} {dtype}")
            ok = _check_fresh_dispatch(buf, xs, fresh, recv_x if dtype == "bf16" else recv_fp8, recv_idx, rank, variant) \
                if spec.check else "skipped"
            t = internode.timed(lambda: buf.dispatch(xs, **fresh), device, group)
            rows.add(mode="ht", op=f"dispatch-{variant}", dtype=dtype, tokens=T, experts=E, bytes=bf16_bytes * factor,
                     time_s=t["mean"], synced_s=t["synced_mean"], baseline_s=base, verified=ok,
                     **internode.fields(factor, t["mean"]))


def _check_fresh_dispatch(buf, xs, kwargs: dict, expected_x, expected_idx, rank: int, variant: str) -> str:
    """A dispatch with new routing (layout tensors, no handle; ``num_worst_tokens`` for "worst") places
    the same rows as the verified one, bit for bit; a "worst" output's rows past the real count carry
    top-k id -1."""
    out_x, out_idx, *_ = buf.dispatch(xs, **kwargs)
    got = out_x if isinstance(out_x, tuple) else (out_x,)
    want = expected_x if isinstance(expected_x, tuple) else (expected_x,)
    n = want[0].shape[0]
    worst = kwargs.get("num_worst_tokens", 0)
    if got[0].shape[0] != (worst or n):
        raise AssertionError(f"rank {rank}: HT dispatch ({variant}) returned {got[0].shape[0]} rows, "
                             f"expected {worst or n}")
    for g, w in zip(got, want):
        if not torch.equal(g[:n].contiguous().view(torch.uint8), w.contiguous().view(torch.uint8)):
            raise AssertionError(f"rank {rank}: HT dispatch ({variant}) rows differ from the cached dispatch's")
    if not torch.equal(out_idx[:n], expected_idx) or bool((out_idx[n:] != -1).any()):
        raise AssertionError(f"rank {rank}: HT dispatch ({variant}) top-k ids differ (or padding rows are not -1)")
    return "ok"


def _ranks_per_node(spec: BenchSpec, world: int) -> int | None:
    if not spec.nodes:
        return None
    if spec.nodes < 1 or world % spec.nodes:
        raise ValueError(f"--nodes {spec.nodes} does not divide {world} ranks")
    return world // spec.nodes


# Summed counters of an `ipc` proxy transport the bench reads (besides the per-destination and
# per-engine ones folded into "delivered" and "copies" by _proxy_snapshot).
_SNAPSHOT_KEYS = ("ipc_post_to_deliver_ns", "ipc_submit_ns", "ipc_inbox_ns", "ipc_received", "copy_kernel_wait_ns",
                  "copy_kernel_copy_ns", "copy_kernel_descs", "ipc_ring_done_seen_ns", "ipc_ring_done_seen",
                  "copy_kernel_push_seen_ns", "copy_kernel_push_start_ns", "copy_kernel_launches",
                  "ipc_ring_push_post_ns", "ipc_ring_post_seen_ns", "ipc_ring_taken", "ipc_ring_pushes",
                  "copy_role_descs", "copy_role_passes", "copy_role_read_cycles", "copy_role_take_cycles",
                  "copy_role_scan_cycles", "copy_role_publish_cycles", "copy_role_pass_ns", "copy_role_pass_cycles")
# Sums of signed nanoseconds the native side and the copy kernel keep in unsigned 64-bit words (an
# overlapped copy kernel starts before the push it serves: transport/copy_ring.cu).
_SIGNED_KEYS = ("ipc_ring_push_post_ns", "ipc_ring_post_seen_ns", "copy_kernel_push_seen_ns",
                "copy_kernel_push_start_ns")


def _proxy_snapshot(counters_fn) -> dict | None:
    """The summed counters of an `ipc` proxy transport (_SNAPSHOT_KEYS, 0 when absent, plus
    `delivered`: writes delivered to every destination, and `copies`: copy submissions of every
    engine), or None for another transport."""
    if counters_fn is None:
        return None
    c = dict(counters_fn())
    if "ipc_post_to_deliver_ns" not in c:
        return None
    out = {k: int(c.get(k, 0)) for k in _SNAPSHOT_KEYS}
    out["delivered"] = sum(int(v) for k, v in c.items() if k.startswith("ipc_delivered_to_"))
    out["copies"] = sum(int(v) for k, v in c.items() if k.startswith("ipc_") and k.endswith("_copies"))
    return out


def _proxy_fields(before: dict | None, after: dict | None, calls: int) -> dict:
    """Where the proxy path's time goes, between two snapshots: proxy writes per op, their mean
    post->delivery time (copy done, record in the receiver's inbox), the mean time the proxy thread
    spent inside one copy submission (the CUDA driver call on the ipc stand-in: large values mean it
    waited on another thread), the mean time a record waited in the receiver's inbox, and with ipc
    "kernel" copies: the copy kernel's mean wait for a descriptor and its copy time per descriptor,
    how much later than at best the proxy saw its `done` (GPU and host clocks differ by an offset:
    see ipc_copy.cc), per launch (GPU clock only) the send kernel's push -> the copy kernel's
    start and -> its first descriptor seen, and that push -> seen split at the proxy's posting
    (push -> posted: the proxy picking the command up; posted -> seen: the descriptor fetch; GPU
    stamps read on the host clock, ipc_copy.cc)."""
    if before is None or after is None or calls <= 0 or after["delivered"] <= before["delivered"]:
        return {}
    d = {k: after[k] - before[k] for k in after}
    for k in _SIGNED_KEYS:  # two's complement difference
        d[k] = (d[k] + (1 << 63)) % (1 << 64) - (1 << 63)
    n = d["delivered"]
    out = {"proxy_writes": n / calls, "proxy_hop_us": d["ipc_post_to_deliver_ns"] / n / 1e3}

    def mean_us(total: str, count: str, field: str) -> None:
        if d[count] > 0:
            out[field] = d[total] / d[count] / 1e3

    mean_us("ipc_submit_ns", "copies", "proxy_submit_us")
    mean_us("ipc_inbox_ns", "ipc_received", "proxy_inbox_us")  # records the receiving proxies took
    mean_us("copy_kernel_wait_ns", "copy_kernel_descs", "copy_wait_us")  # per descriptor: waiting for it,
    mean_us("copy_kernel_copy_ns", "copy_kernel_descs", "copy_us")       # then copying it
    mean_us("ipc_ring_done_seen_ns", "ipc_ring_done_seen", "done_seen_us")  # the proxy seeing `done`
    mean_us("copy_kernel_push_start_ns", "copy_kernel_launches", "push_start_us")
    mean_us("copy_kernel_push_seen_ns", "copy_kernel_launches", "push_seen_us")
    mean_us("ipc_ring_push_post_ns", "ipc_ring_pushes", "push_post_us")  # host clock: the proxy's pick-up,
    mean_us("ipc_ring_post_seen_ns", "ipc_ring_taken", "post_seen_us")  # then the copy kernel's fetch
    if d["copy_role_passes"] > 0 and d["copy_role_pass_cycles"] > 0:  # the normal-mode copy role's fetcher
        ns_per_cycle = d["copy_role_pass_ns"] / d["copy_role_pass_cycles"]
        out["copy_pass_us"] = d["copy_role_pass_ns"] / d["copy_role_passes"] / 1e3
        for stage in ("read", "take", "scan", "publish"):  # per pass, by stage (the rest: pauses)
            out[f"copy_{stage}_us"] = d[f"copy_role_{stage}_cycles"] * ns_per_cycle / d["copy_role_passes"] / 1e3
    return out


def _synced_iters(spec: BenchSpec) -> int:
    return max(1, min(spec.iters, 10))


def _timed_with_proxy(fn, spec: BenchSpec, device, group, counters_fn, on_timed=None) -> tuple[dict, dict]:
    before = _proxy_snapshot(counters_fn)
    t = time_op(fn, spec.iters, spec.warmup, device, group, synced_iters=_synced_iters(spec), on_timed=on_timed)
    return t, _proxy_fields(before, _proxy_snapshot(counters_fn), int(t["calls"]))


def nic_fields(nic_bytes: float, time_s: float, cap_gbps: float) -> dict:
    """Bytes per op through the NIC model -> its GB/s (per rank) and share of the cap."""
    gbps = nic_bytes / 1e9 / time_s if time_s > 0 else 0.0
    return dict(nic_bytes=nic_bytes, nic_gbps=gbps, nic_cap_gbps=cap_gbps, nic_of_cap=gbps / cap_gbps if cap_gbps else 0.0)


# the links' idle time and idle stretches (>= 2 us), and those by length: every counter
# nic_model_idle_ge<N>us the model reports (its buckets are nic_model.cc's Link::kBucketUs)
_NIC_IDLE = ("nic_model_idle_ns", "nic_model_idle_gaps")
_NIC_IDLE_BY_LENGTH = "nic_model_idle_ge"
_NIC_WAIT = ("nic_model_wait_ns", "nic_model_writes")  # summed post -> due over the Writes through the model


class _InternodeRows:
    """Extra fields of internode HT rows: DeepEP's RDMA-formula bytes and GB/s, nodes, the bytes
    the proxy transport copied per op, and under a NIC model (``spec.nic_model``) the bytes that
    went through it per op, their GB/s and that rate's share of the model's cap (bw x nics of a
    rank), all measured around the timed calls."""

    def __init__(self, buf, ntprr, hidden: int, spec: BenchSpec) -> None:
        self.on = buf.topology.is_internode and ntprr is not None
        self.nodes = buf.topology.num_nodes
        self.rdma_bf16 = int(ntprr.sum()) * hidden * 2 if self.on else 0
        self.spec = spec
        ex = buf._executor
        eng = getattr(ex, "_ht", None)
        self._counters = getattr(eng, "transport_counters", None) or \
            getattr(getattr(ex, "proxy", None), "transport_counters", None)
        self.per_op = None
        self.nic_per_op = None
        self.nic_idle = None
        self.hop: dict = {}
        from ..proxy.nic_model import parse_nic_model
        model = parse_nic_model(spec.nic_model, "--nic-model")
        self.cap_gbps = model.cap_bytes_per_s / 1e9 if model is not None else 0.0

    def _counter(self, name: str):
        if self._counters is None:
            return None
        value = dict(self._counters()).get(name)
        return int(value) if value is not None else None

    def timed(self, fn, device, group) -> dict:
        before = self._counter("ipc_copy_bytes") if self.on else None
        modelled = self.on and bool(self.cap_gbps)
        nic_before = self._counter("nic_model_bytes") if modelled else None
        idle: dict[str, list] = {}  # the links' idle time and stretches (nic_model.cc Link), back to back only

        def on_timed(when: str) -> None:  # one reading of every counter: the marks stay close to the calls
            now = dict(self._counters())
            idle[when] = {k: int(v) for k, v in now.items()
                          if k in _NIC_IDLE or k in _NIC_WAIT or k.startswith(_NIC_IDLE_BY_LENGTH)}

        t, self.hop = _timed_with_proxy(fn, self.spec, device, group, self._counters if self.on else None,
                                        on_timed if modelled else None)
        after = self._counter("ipc_copy_bytes") if before is not None else None
        nic_after = self._counter("nic_model_bytes") if nic_before is not None else None
        calls, timed = int(t["calls"]), int(t["timed_calls"])
        self.per_op = (after - before) / calls if after is not None and calls else None
        self.nic_per_op = (nic_after - nic_before) / calls if nic_after is not None and calls else None
        self.nic_idle = None
        start, end = idle.get("start", {}), idle.get("end", {})
        if modelled and timed and all(k in start and k in end for k in _NIC_IDLE):
            self.nic_idle = {k: (end[k] - start[k]) / timed for k in start if k in end and k not in _NIC_WAIT}
            writes = end.get("nic_model_writes", 0) - start.get("nic_model_writes", 0)
            if writes > 0:  # a Write's mean post -> due: link queue, serialization, latency, reordering
                self.nic_idle["wait_us"] = (end["nic_model_wait_ns"] - start["nic_model_wait_ns"]) / writes / 1e3
        return t

    def fields(self, factor: float, time_s: float) -> dict:
        if not self.on:
            return {}
        rdma = self.rdma_bf16 * factor
        out = dict(nodes=self.nodes, rdma_bytes=rdma, rdma_gbps=rdma / 1e9 / time_s if time_s > 0 else 0.0)
        if self.per_op is not None:
            out["transport_bytes"] = self.per_op
        if self.nic_per_op is not None:
            out.update(nic_fields(self.nic_per_op, time_s, self.cap_gbps))
        if self.nic_idle is not None:  # per back-to-back op
            out.update(nic_idle_us=self.nic_idle["nic_model_idle_ns"] / 1e3,
                       nic_idle_gaps=self.nic_idle["nic_model_idle_gaps"])
            out.update({k.replace("nic_model_", "nic_"): v for k, v in self.nic_idle.items()
                        if k.startswith(_NIC_IDLE_BY_LENGTH)})
            if "wait_us" in self.nic_idle:
                out["nic_wait_us"] = self.nic_idle["wait_us"]
        out.update(self.hop)
        return out


def _raise_pending_error(buf, device) -> None:
    """The executor's own error (a device timeout, a failed proxy) before any output is checked:
    outputs of a failed op are not worth comparing, the error says what went wrong."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    check = getattr(getattr(buf, "_executor", None), "check_error", None)
    if check is not None:
        check()


def _bench_ll(spec: BenchSpec, group, rank: int, world: int, device, rows: _Rows, progress: Callable[[str], None]):
    gen = torch.Generator().manual_seed(spec.seed * 1000 + 500 + rank)
    T, H, K, E = spec.ll_tokens, spec.hidden, spec.num_topk, spec.ll_experts
    rdma = Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    buf = Buffer(group, 0, rdma, low_latency_mode=True, num_qps_per_rank=max(1, E // world), backend=spec.backend,
                 allow_nvlink_for_low_latency_mode=not spec.ll_proxy, ranks_per_node=_ranks_per_node(spec, world),
                 tuning=Tuning.from_pairs(spec.tune))
    # nodes of several ranks (--nodes): the node's peers over NVLink, the other nodes through the proxy
    hybrid = bool(getattr(getattr(buf._executor, "_ll", None), "hybrid", None) and buf._executor._ll.hybrid.peers)
    if (spec.ll_proxy or buf.topology.is_internode) and buf.backend == "cuda":  # rows say which path they measured
        rows.common["backend"] = f"{buf.backend}+{'hybrid' if hybrid else 'proxy'}"
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(device)
    topk_idx, topk_weights = _routing(T, E, K, device, gen)
    num_sel = int((topk_idx >= 0).sum())
    verified = "skipped"
    (q, scales), recv_count, handle, _, _ = buf.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)
    bf16_x, recv_count_bf16, handle_bf16, _, _ = buf.low_latency_dispatch(x, topk_idx, T, E, use_fp8=False)
    y = bf16_x.clone()
    combined, _, _ = buf.low_latency_combine(y, topk_idx, topk_weights, handle_bf16)
    if spec.check:
        progress("ll: verifying")
        _raise_pending_error(buf, device)
        check_ll("uccl-ep", rank, ll_expected(x, topk_idx, topk_weights, group), E, world, bf16_x, recv_count_bf16,
                 handle_bf16, q, recv_count, handle, combined)
        verified = "ok"
    per_dest = [0] * world
    per_rank = E // world
    for r in range(world):
        per_dest[r] = int(((topk_idx >= 0) & (topk_idx.div(per_rank, rounding_mode="floor") == r)).sum())
    progress("ll: timing dispatch fp8")
    # the engine's counters (the cuda proxy path adds its copy kernel's), else its proxy's (host executor)
    ll_eng = getattr(buf._executor, "_ll", None) if spec.ll_proxy or buf.topology.is_internode else None
    counters = getattr(ll_eng, "transport_counters", None) or \
        getattr(getattr(ll_eng, "proxy", None), "transport_counters", None)
    t_disp, hop_disp = _timed_with_proxy(lambda: buf.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True), spec,
                                         device, group, counters)
    base_disp = _a2a_baseline(group, per_dest, H * 2, device, spec)
    rows.add(mode="ll", op="dispatch", dtype="fp8", tokens=T, experts=E, bytes=num_sel * (H + H // 128 * 4 + 16),
             time_s=t_disp["median"], synced_s=t_disp["synced_mean"], baseline_s=base_disp, verified=verified,
             **hop_disp)
    progress("ll: timing combine")
    t_comb, hop_comb = _timed_with_proxy(lambda: buf.low_latency_combine(y, topk_idx, topk_weights, handle_bf16),
                                         spec, device, group, counters)
    rows.add(mode="ll", op="combine", dtype="bf16", tokens=T, experts=E, bytes=num_sel * H * 2,
             time_s=t_comb["median"], synced_s=t_comb["synced_mean"], baseline_s=base_disp, verified=verified,
             **hop_comb)
    _bench_ll_logfmt(spec, buf, group, x, topk_idx, topk_weights, y, handle_bf16, device, rows, num_sel, base_disp,
                     counters, progress)
    if buf.backend == "cuda":
        _bench_ll_graph(spec, buf, group, x, topk_idx, topk_weights, y, device, rows, num_sel, base_disp, verified,
                        progress)


def _bench_ll_logfmt(spec, buf, group, x, topk_idx, topk_weights, y, handle, device, rows: _Rows, num_sel, base_s,
                     counters, progress):
    """LogFMT combine (use_logfmt=True) of the same rows scaled by 0.1, so that divisions are cast
    (|x| < 1); bytes by DeepEP's formula, 10H/8 + H/128 * 4 per selection."""
    T, H, E = spec.ll_tokens, spec.hidden, spec.ll_experts
    y_small = (y.float() * 0.1).to(torch.bfloat16)
    verified = "skipped"
    if spec.check:
        got, _, _ = buf.low_latency_combine(y_small, topk_idx, topk_weights, handle, use_logfmt=True)
        want, _, _ = buf.low_latency_combine(y_small, topk_idx, topk_weights, handle)
        diff = utils.calc_diff(got.float(), want.float())
        if diff >= 9e-4:  # DeepEP's tolerance for LogFMT combine
            raise AssertionError(f"rank {dist.get_rank(group)}: LL LogFMT combine calc_diff {diff:.3g} >= 9e-4")
        verified = "ok"
    progress("ll: timing combine (LogFMT)")
    t, hop = _timed_with_proxy(lambda: buf.low_latency_combine(y_small, topk_idx, topk_weights, handle,
                                                               use_logfmt=True), spec, device, group, counters)
    rows.add(mode="ll", op="combine", dtype="logfmt", tokens=T, experts=E, bytes=num_sel * logfmt.message_bytes(H),
             time_s=t["median"], synced_s=t["synced_mean"], baseline_s=base_s, verified=verified, **hop)


def _bench_ll_graph(spec, buf, group, x, topk_idx, topk_weights, y, device, rows: _Rows, num_sel, base_s, verified,
                    progress):
    """Dispatch (FP8) + combine captured in one CUDA graph and replayed: device time without the
    host's per-call work (how serving frameworks run LL decode)."""
    T, H, E = spec.ll_tokens, spec.hidden, spec.ll_experts
    progress("ll: timing dispatch+combine (CUDA graph)")
    dist.barrier(group=group)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        _, _, h, _, _ = buf.low_latency_dispatch(x, topk_idx, T, E, use_fp8=True)
        buf.low_latency_combine(y, topk_idx, topk_weights, h)
    torch.cuda.synchronize()
    dist.barrier(group=group)
    t = time_op(graph.replay, spec.iters, spec.warmup, device, group, synced_iters=_synced_iters(spec))
    rows.add(mode="ll", op="dispatch+combine graph", dtype="fp8+bf16", tokens=T, experts=E,
             bytes=num_sel * (H + H // 128 * 4 + 16 + 2 * H), time_s=t["median"], synced_s=t["synced_mean"],
             baseline_s=2 * base_s,
             verified=verified)


def run_rank(rank: int, world: int, spec_dict: dict, progress_queue: Any = None) -> list[dict[str, Any]]:
    """Body of one benchmark rank (the process group is already initialized)."""
    spec = BenchSpec(**spec_dict)
    group, device, progress = rank_context(rank, progress_queue)

    probe = Buffer(group, 0, 0, backend=spec.backend)
    rows = _Rows(spec, world, probe.backend, device)
    if spec.mode in ("ht", "both"):
        _bench_ht(spec, group, rank, world, device, rows, progress)
    if spec.mode in ("ll", "both"):
        _bench_ll(spec, group, rank, world, device, rows, progress)
    progress("done")
    return rows.rows


def spec_to_dict(spec: BenchSpec) -> dict:
    return asdict(spec)
