"""Result checks of the benchmarks, shared by `uccl-ep bench` and its matrix, for any library
behind DeepEP V1's Buffer API (uccl-ep, or DeepEP itself as the baseline).

The expected values come from every rank's inputs, all-gathered, through `expect` (independent of
`uccl_ep.refs`) and `uccl_ep.refs.fp8` (DeepEP's FP8 cast, bitwise). Gathering is collective, so
it happens once per shape in `ht_expected` / `ll_expected`; the checks themselves are local and
raise AssertionError naming the rank, the library and what differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import utils
from ..refs.fp8 import per_token_cast_to_fp8
from .expect import check_ll_dispatch, expected_normal_recv, fp8_codes_within_one_step

__all__ = ["gather", "HtExpected", "ht_expected", "check_ht", "LlExpected", "ll_expected", "check_ll"]


def gather(t: torch.Tensor, group) -> list[torch.Tensor]:
    """All-gather tensors of equal shape (any dtype) through bytes."""
    world = dist.get_world_size(group)
    device = t.device if (t.device.type == "cuda" and "nccl" in str(dist.get_backend(group)).lower()) \
        else torch.device("cpu")
    b = t.contiguous().view(torch.uint8).reshape(-1).to(device)
    out = [torch.empty_like(b) for _ in range(world)]
    dist.all_gather(out, b, group=group)
    return [o.view(t.dtype).view(t.shape).to(t.device) for o in out]


@dataclass
class HtExpected:  # on the inputs' device
    rows: torch.Tensor          # BF16 rows this rank receives, by (source rank, source token)
    fp8_q: torch.Tensor         # their FP8 bytes (uint8 view)
    fp8_s: torch.Tensor         # their scales
    recv_per_source: list[int]  # rows received from each rank (what combine sends back)
    combined: torch.Tensor      # combine of the received rows unchanged: x * ranks each token went to (x's device)


def ht_expected(x: torch.Tensor, x_fp8, topk_idx: torch.Tensor, group, rank: int, num_experts: int,
                world: int) -> HtExpected:
    all_x, all_topk = gather(x, group), gather(topk_idx, group)
    rows, src_rank, _ = expected_normal_recv(all_x, all_topk, rank, num_experts, world)
    q, _, _ = expected_normal_recv(gather(x_fp8[0], group), all_topk, rank, num_experts, world)
    s, _, _ = expected_normal_recv(gather(x_fp8[1], group), all_topk, rank, num_experts, world)
    per_rank = num_experts // world
    dest = topk_idx.div(per_rank, rounding_mode="floor")
    count = torch.stack([((topk_idx >= 0) & (dest == r)).any(1) for r in range(world)], 1).sum(1, keepdim=True)
    recv_per_source = [int((src_rank == r).sum()) for r in range(world)]
    return HtExpected(rows, q.view(torch.uint8), s, recv_per_source, x.float() * count.float())


def check_ht(lib: str, rank: int, exp: HtExpected, recv_x: torch.Tensor, recv_fp8, combined: torch.Tensor) -> None:
    """Normal mode: BF16 and FP8 dispatch bitwise (the ops only move bytes), combine by DeepEP's
    calc_diff."""
    if not torch.equal(recv_x, exp.rows):
        raise AssertionError(f"rank {rank}: {lib} HT dispatch rows differ from the expected rows")
    if not (torch.equal(recv_fp8[0].view(torch.uint8), exp.fp8_q) and torch.equal(recv_fp8[1], exp.fp8_s)):
        raise AssertionError(f"rank {rank}: {lib} HT FP8 dispatch bytes differ from the expected rows")
    diff = utils.calc_diff(combined.float(), exp.combined)
    if diff > 5e-6:
        raise AssertionError(f"rank {rank}: {lib} HT combine calc_diff {diff:.3g} > 5e-6")


@dataclass
class LlExpected:
    all_x: list[torch.Tensor]
    all_q: list[torch.Tensor]
    all_topk: list[torch.Tensor]
    combined: torch.Tensor  # combine of the BF16-dispatched rows unchanged: x * sum of valid weights (x's device)


def ll_expected(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, group) -> LlExpected:
    all_x, all_topk = gather(x, group), gather(topk_idx, group)
    all_q = [per_token_cast_to_fp8(v)[0].view(torch.uint8) for v in all_x]
    w = torch.where(topk_idx >= 0, topk_weights, torch.zeros_like(topk_weights)).sum(1, keepdim=True)
    return LlExpected(all_x, all_q, all_topk, x.float() * w)


def check_ll(lib: str, rank: int, exp: LlExpected, num_experts: int, world: int, bf16_x, bf16_count, bf16_handle,
             q, fp8_count, fp8_handle, combined: torch.Tensor) -> None:
    """Low latency: BF16 and FP8 dispatch bitwise per (expert, source) segment (slot order within
    a segment is the sender's), combine by DeepEP's calc_diff.

    NOTES: uccl-ep's FP8 rows must equal uccl_ep.refs.fp8's codes bit for bit; DeepEP's LL kernel
    casts with its own arithmetic (the scale's reciprocal, fast math), so its codes are held to
    one step of e4m3 (the documented tolerance; a wrong row is off by far more)."""
    fp8_match = torch.equal if lib == "uccl-ep" else fp8_codes_within_one_step
    try:
        check_ll_dispatch(lambda e, b, n: bf16_x[e, b:b + n], bf16_count, bf16_handle, exp.all_x, exp.all_topk, rank,
                          num_experts, world)
        check_ll_dispatch(lambda e, b, n: q[e, b:b + n].view(torch.uint8), fp8_count, fp8_handle, exp.all_q,
                          exp.all_topk, rank, num_experts, world, rows_match=fp8_match)
    except AssertionError as e:
        raise AssertionError(f"{lib}: {e}") from e
    diff = utils.calc_diff(combined.float(), exp.combined)
    if diff > 1e-5:
        raise AssertionError(f"rank {rank}: {lib} LL combine calc_diff {diff:.3g} > 1e-5")
