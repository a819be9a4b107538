"""Independent expectations for benchmark and test checks.

These compute, from every rank's inputs (all-gathered), what a rank must receive, with plain
loops and masks: they share no code with `uccl_ep.refs`, so a check against them is a check of
the reference too.
"""

from __future__ import annotations

import torch

__all__ = ["expected_normal_recv", "expected_ll_segments", "check_ll_dispatch", "fp8_codes_within_one_step",
           "LLCheckError"]


class LLCheckError(AssertionError):
    pass


def expected_normal_recv(all_x: list[torch.Tensor], all_topk: list[torch.Tensor], me: int, num_experts: int,
                         num_ranks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows rank ``me`` receives in normal dispatch: (x rows, source rank, source token), ordered by
    (source rank, source token)."""
    per_rank = num_experts // num_ranks
    rows, src_rank, src_tok = [], [], []
    for i, (x, topk) in enumerate(zip(all_x, all_topk)):
        goes_here = ((topk >= 0) & (topk.div(per_rank, rounding_mode="floor") == me)).any(dim=1)
        tokens = torch.nonzero(goes_here).flatten()
        rows.append(x[tokens])
        src_rank.append(torch.full((tokens.numel(),), i, dtype=torch.int64))
        src_tok.append(tokens.cpu().long())
    return torch.cat(rows), torch.cat(src_rank), torch.cat(src_tok)


def expected_ll_segments(all_topk: list[torch.Tensor], me: int, num_experts: int,
                         num_ranks: int) -> dict[tuple[int, int], list[int]]:
    """{(local expert, source rank): sorted source tokens} for low-latency dispatch to ``me``."""
    per_rank = num_experts // num_ranks
    seg: dict[tuple[int, int], list[int]] = {}
    for j, topk in enumerate(all_topk):
        topk = topk.cpu()
        for e in range(per_rank):
            tokens = torch.nonzero((topk == me * per_rank + e).any(dim=1)).flatten().tolist()
            if tokens:
                seg[(e, j)] = tokens
    return seg


def fp8_codes_within_one_step(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether e4m3 codes (uint8 views) agree up to one step of the format: the same sign and codes at
    most 1 apart, or both zero (+0 / -0)."""
    g, w = got.to(torch.int16), want.to(torch.int16)
    same_sign = (g & 0x80) == (w & 0x80)
    zeros = ((g & 0x7F) == 0) & ((w & 0x7F) == 0)
    return bool(((same_sign & ((g - w).abs() <= 1)) | zeros).all())


def check_ll_dispatch(recv_rows_fn, recv_count: torch.Tensor, handle, all_source_rows: list[torch.Tensor],
                      all_topk: list[torch.Tensor], me: int, num_experts: int, num_ranks: int,
                      masked: set[int] = frozenset(), rows_match=torch.equal) -> int:
    """Check an LL dispatch per (expert, source) segment; returns the rows checked.

    ``recv_rows_fn(e, begin, count)`` returns the received rows of local expert e as a tensor
    comparable with ``all_source_rows[j][tokens]`` (e.g. raw bytes, or dequantized values);
    ``rows_match(got, want)`` compares them (bitwise by default).
    """
    src_info, layout_range = handle[0].cpu(), handle[1].cpu()
    per_rank = num_experts // num_ranks
    want = expected_ll_segments(all_topk, me, num_experts, num_ranks)
    counts = recv_count.cpu().tolist()
    checked = 0
    for e in range(per_rank):
        expected_total = sum(len(v) for (ee, j), v in want.items() if ee == e and j not in masked)
        if counts[e] != expected_total:
            raise LLCheckError(f"rank {me} expert {e}: recv_count {counts[e]} != expected {expected_total}")
        spans = []
        for j in range(num_ranks):
            packed = int(layout_range[e, j])
            begin, count = packed >> 32, packed & 0xFFFFFFFF
            tokens = [] if j in masked else want.get((e, j), [])
            if count != len(tokens):
                raise LLCheckError(f"rank {me} expert {e} source {j}: count {count} != expected {len(tokens)}")
            if count == 0:
                continue
            spans.append((begin, begin + count))
            got_src = src_info[e, begin:begin + count].long()
            order = torch.argsort(got_src)
            if got_src[order].tolist() != tokens:
                raise LLCheckError(f"rank {me} expert {e} source {j}: src_info {got_src.tolist()} != {tokens}")
            got_rows = recv_rows_fn(e, begin, count)[order]
            exp_rows = all_source_rows[j][torch.tensor(tokens)]
            if not rows_match(got_rows.cpu(), exp_rows.cpu()):
                diff = (got_rows.cpu().float() - exp_rows.cpu().float()).abs().max().item()
                raise LLCheckError(f"rank {me} expert {e} source {j}: received rows differ (max abs diff {diff})")
            checked += count
        spans.sort()
        for (a0, a1), (b0, _) in zip(spans, spans[1:]):
            if a1 > b0:
                raise LLCheckError(f"rank {me} expert {e}: overlapping source segments {spans}")
        if spans and (spans[0][0] != 0 or spans[-1][1] != counts[e] or
                      sum(b - a for a, b in spans) != counts[e]):
            raise LLCheckError(f"rank {me} expert {e}: segments {spans} do not tile [0, {counts[e]})")
    return checked
